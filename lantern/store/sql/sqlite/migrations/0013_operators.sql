-- Who acts on runs: a key's name, and the name of the key that decided at an approval.

ALTER TABLE api_keys ADD COLUMN name TEXT;
ALTER TABLE approvals ADD COLUMN decided_by_name TEXT;
