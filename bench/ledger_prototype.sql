-- The tables of the ledger layout (docs/storage_ledger.md), as bench/wal_records and
-- bench/ledger_speed build them beside tenure's own tables: a prototype of the writes, not a queue
-- (no functions, no grants, no retirement). Run with psql -v s=<schema> after `tenure migrate`
-- made that schema (the job ids come from its job_id_seq).
CREATE TABLE :s.ledger_jobs (
  id bigint PRIMARY KEY, queue text NOT NULL, kind text NOT NULL, args jsonb NOT NULL,
  priority smallint NOT NULL, run_at timestamptz NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
  max_attempts int NOT NULL, metadata jsonb NOT NULL);
-- The claim order, narrow: what a claim locks and deletes.
CREATE TABLE :s.ledger_ready (
  job_id bigint PRIMARY KEY, queue text NOT NULL, priority smallint NOT NULL, run_at timestamptz NOT NULL,
  run_lease bigint NOT NULL, attempt int NOT NULL);
CREATE INDEX ledger_ready_claim ON :s.ledger_ready (queue, priority, run_at, job_id);
-- One row per claim statement; an attempt is (claim_id, pos), pos its 1-based place in the arrays.
CREATE TABLE :s.ledger_claims (
  claim_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL, worker text NOT NULL,
  claimed_at timestamptz NOT NULL, lo bigint NOT NULL, hi bigint NOT NULL, job_ids bigint[] NOT NULL,
  run_leases bigint[] NOT NULL, secrets uuid[] NOT NULL);
CREATE INDEX ledger_claims_jobs ON :s.ledger_claims USING gist (int8range(lo, hi, '[]'));
-- One narrow row per closed attempt; its key is the guard (a second closure cannot commit).
CREATE TABLE :s.ledger_closures (
  claim_id bigint NOT NULL, pos int NOT NULL, outcome "char" NOT NULL, closed_at timestamptz NOT NULL,
  PRIMARY KEY (claim_id, pos));
