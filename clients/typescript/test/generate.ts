// `npm run generate`: src/openapi.ts from a real `lantern serve`'s /openapi.json.
import { writeFileSync } from "node:fs";
import { GENERATED, fetchSchema, typesOf } from "./schema.js";
import { Server } from "./server.js";

const server = await new Server().start();
try {
  writeFileSync(GENERATED, await typesOf(await fetchSchema(server.url)));
  console.log(`wrote ${GENERATED} from ${server.url}/openapi.json`);
} finally {
  await server.close();
}
