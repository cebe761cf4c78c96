// The client's types come from the server's OpenAPI document: `npm run generate` writes
// src/openapi.ts with openapi-typescript from a real `lantern serve`'s /openapi.json, and the
// suite compiles the client against the document of the server it tests (`compileAgainst`), so
// a field the server renamed or dropped fails the suite even before src/openapi.ts is
// regenerated, while fields it added do not.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import openapiTS, { COMMENT_HEADER, type OpenAPI3, astToString } from "openapi-typescript";
import ts from "typescript";

export const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const GENERATED = join(PACKAGE, "src", "openapi.ts");

export async function fetchSchema(url: string): Promise<OpenAPI3> {
  const answer = await fetch(`${url}/openapi.json`);
  if (!answer.ok) throw new Error(`GET ${url}/openapi.json answered ${answer.status}`);
  return (await answer.json()) as OpenAPI3;
}

/** The TypeScript module openapi-typescript makes of the document. */
export async function typesOf(schema: OpenAPI3): Promise<string> {
  const ast = await openapiTS(schema, { silent: true });
  const note = "// Regenerate with `npm run generate` (it starts a lantern serve).\n\n";
  return COMMENT_HEADER + note + astToString(ast);
}

/** Whether the committed src/openapi.ts is what the document generates. */
export function isCurrent(types: string): boolean {
  return readFileSync(GENERATED, "utf8") === types;
}

/** Type-check the client's sources once per `types` given as src/openapi.ts, without Node's
 * types (the client needs nothing but the platform's fetch): tsc's errors for each, "" when it
 * passed. In this process, sharing the parsed standard library between the checks. */
export function compileAgainst(...variants: string[]): string[] {
  const config = ts.getParsedCommandLineOfConfigFile(join(PACKAGE, "tsconfig.json"), {}, {
    ...ts.sys,
    onUnRecoverableConfigFileDiagnostic: (d) => {
      throw new Error(ts.flattenDiagnosticMessageText(d.messageText, "\n"));
    },
  });
  if (config === undefined) throw new Error("no tsconfig.json");
  const options = { ...config.options, noEmit: true, incremental: false, types: [] };
  const sources = config.fileNames.filter((name) => name.startsWith(join(PACKAGE, "src")));
  const parsed = new Map<string, ts.SourceFile>();
  let previous: ts.Program | undefined;
  return variants.map((types) => {
    const host = ts.createCompilerHost(options);
    host.readFile = (name) => (name === GENERATED ? types : ts.sys.readFile(name));
    host.getSourceFile = (name, language) => {
      if (name === GENERATED) return ts.createSourceFile(name, types, language);
      let file = parsed.get(name);
      if (file === undefined) {
        const text = ts.sys.readFile(name);
        if (text === undefined) return undefined;
        file = ts.createSourceFile(name, text, language);
        parsed.set(name, file);
      }
      return file;
    };
    const program = ts.createProgram(sources, options, host, previous);
    previous = program;
    return ts.formatDiagnostics(ts.getPreEmitDiagnostics(program), host);
  });
}
