/*
 * token_secret.pml -- SPIN model of the attempt secret that a finalization token carries
 * (docs/design.md sections 1 and 3; SQL in adapters/postgres/sql/0006_attempt_secrets.sql,
 * 0014_parked_callbacks.sql, 0015_token_write_checks_secret.sql).
 *
 * The durable name of an attempt, (job_id, run_lease), is not unique in two ways:
 *   - a parked attempt that is resumed is continued by a new claim with the SAME run lease
 *     (claim_attempts, migration 14) and a fresh secret;
 *   - an asynchronous failover loses the commits the standby had not replayed: a claim of run
 *     lease L on the lost timeline, and a claim of run lease L again on the promoted standby.
 * Only the secret (gen_random_uuid() at each claim) tells such attempts apart. The model checks
 * that the token-taking functions complete_job and fail_job write only to the attempt whose
 * secret the token carries, against holders of an earlier attempt's token of the same run lease
 * and against an intruder that reads (job_id, run_lease) from the job listings. (heartbeat(token)
 * passes the same check, lock_token_attempt; what it writes, heartbeat_at, is not modelled.)
 *
 * One job; processes (each step maps to one SQL statement or one atomic server action):
 *   worker (x2)  claim_attempts (run_lease + 1, or the same run lease for a continuation; a fresh
 *                secret); then may park the attempt (park_callback) and keep its token (a late
 *                holder); then calls complete_job or fail_job once, in two steps as in the SQL:
 *                token_attempt (reads the receipt's secret, no lock), then the write (since
 *                migration 16: lock the receipt, compare its secret again, write; before it: the
 *                write keyed by (job_id, run_lease) alone); or drops the token. The call is made
 *                either with its own token or as an intruder: with the (job_id, run_lease) of the
 *                open attempt read from the job listings and a guessed secret (never right: 122
 *                random bits).
 *   resumer      resume_callback of a parked attempt: receipt back to ready, same run lease.
 *   rescue       rescue_attempts (one round): a running attempt back to ready (run lease kept; the
 *                next claim advances it).
 *   replication  asynchronous streaming: the standby's copy of the committed state catches up with
 *                the primary at any moment (it may lag arbitrarily).
 *   failover     once: the standby is promoted; the primary's state becomes the standby's copy,
 *                a statement in progress on the old primary fails (its connection is gone).
 *   invariants   ghost observer: safety invariants in every reachable state.
 *
 * Mutants (models/check.sh --model token_secret --mutant NAME); each line is read by check.sh:
 * @mutant lease_only -DMUTANT_LEASE_ONLY
 *         the token functions match (job_id, run_lease) only: no secret check anywhere
 * @mutant lease_only_failover -DMUTANT_LEASE_ONLY -DNO_INTRUDER -DNO_PARK
 *         the same, with no intruder and no parking: only the failover re-issues a run lease
 * @mutant split_check -DMUTANT_SPLIT_CHECK
 *         the secret checked by token_attempt only, the write keyed by (job_id, run_lease)
 *         (migrations 6 to 14: the check and the write are two statements)
 */

/* job states */
#define AVAILABLE  0   /* ready (a continuation when cont) */
#define RUNNING    1   /* receipt open, a handler runs it */
#define PARKED     2   /* receipt open, waiting AND no_handler */
#define COMPLETED  3
#define FAILED     4
#define TERMINAL(s) ((s) >= COMPLETED)

#define NONE       0   /* no secret: no receipt / a guess */

#ifndef MAX_CLAIMS
#define MAX_CLAIMS 3   /* claims explored in all, across both timelines */
#endif
#ifndef REPLAYS
#define REPLAYS    1   /* times the standby catches up before the failover */
#endif

/* token calls */
#define OP_COMPLETE  1 /* complete_job(token) */
#define OP_FAIL      2 /* fail_job(token): retryable, or failed */

/* ---- committed state on the current primary ---- */
byte job_state = AVAILABLE;
byte run_lease = 0;
byte rsecret   = NONE;   /* secret of the open receipt (job_id, run_lease); NONE without one */
bool cont      = false;  /* the ready row is a continuation (resume_payload set) */
byte term_count = 0;     /* ghost: terminal transitions on this timeline */
byte term_secret = NONE; /* ghost: the secret of the attempt the terminal record closed */

/* ---- the standby's copy (what it has replayed) ---- */
byte sb_job_state = AVAILABLE;
byte sb_run_lease = 0;
byte sb_rsecret   = NONE;
bool sb_cont      = false;
byte sb_term_count = 0;
byte sb_term_secret = NONE;

byte timeline = 0;       /* +1 at the failover; a statement spanning it fails */
byte claims = 0;         /* claims made in all (exploration bound; not rolled back) */
byte next_secret = 0;    /* secrets drawn so far: every draw is new (never rolled back) */

inline close_terminal(st) {
  job_state = st;
  term_secret = rsecret;
  term_count++;
  rsecret = NONE
}

/* complete_batch skips a waiting (parked) attempt; fail_attempt does not. */
#define WRITABLE(op) (job_state == RUNNING || (job_state == PARKED && op != OP_COMPLETE))

/* The write's own secret check (0015: the receipt locked, its secret compared again). */
#if defined(MUTANT_LEASE_ONLY) || defined(MUTANT_SPLIT_CHECK)
#define WRITE_SECRET_OK(tok) true
#else
#define WRITE_SECRET_OK(tok) (rsecret == tok)
#endif
#ifdef MUTANT_LEASE_ONLY
#define TOKEN_SECRET_OK(tok) true
#else
#define TOKEN_SECRET_OK(tok) (rsecret == tok)
#endif

/*
 * One call of a token function with the token (tl_lease, tok) as two statements:
 * token_attempt, which reads the receipt by (job_id, run_lease) and compares the secret without a
 * lock, and the write. `st` carries the first statement's answer to the second.
 */
inline token_call(op, tl_lease, tok, st, tl) {
  atomic {                        /* statement 1: token_attempt(token) */
    tl = timeline;
    st = ((job_state == RUNNING || job_state == PARKED) && run_lease == tl_lease && TOKEN_SECRET_OK(tok))
  };
  atomic {                        /* statement 2: the write (complete_batch / fail_attempt),
                                     since 0015 after locking the receipt and comparing its
                                     secret again (one step: the lock holds the row still) */
    if
    :: tl != timeline -> st = false       /* failed over in between: connection error */
    :: else ->
       if
       :: st && WRITABLE(op) && run_lease == tl_lease && WRITE_SECRET_OK(tok) ->
          /* the property: a token writes only to the attempt whose secret it carries */
          assert(rsecret == tok && tok != NONE);
          if
          :: op == OP_COMPLETE -> close_terminal(COMPLETED)
          :: op == OP_FAIL ->
             if
             :: job_state = AVAILABLE; cont = false; rsecret = NONE   /* retryable */
             :: close_terminal(FAILED)                                 /* attempts spent */
             fi
          fi
       :: else -> st = false    /* TN001 */
       fi
    fi;
    st = false;
    tl = 0
  }
}

inline pick_op(op) {
  if
  :: op = OP_COMPLETE
  :: op = OP_FAIL
  fi
}

proctype worker() {
  byte my_lease = 0;
  byte tok = NONE;
  byte op = 0;
  bool st = false;
  byte tl = 0;
end_idle:
  do
  :: atomic {                       /* claim_attempts */
       job_state == AVAILABLE && claims < MAX_CLAIMS ->
       claims++;
       if
       :: cont -> cont = false      /* continuation of a parked attempt: same run lease */
       :: else -> run_lease++
       fi;
       job_state = RUNNING;
       next_secret++;
       rsecret = next_secret;       /* gen_random_uuid() */
       my_lease = run_lease;
       tok = rsecret
     };
#ifndef NO_PARK
     if
     :: atomic {                    /* park_callback(job_id, run_lease, callback_id): the
                                       callback id names this attempt's current callback */
          job_state == RUNNING && run_lease == my_lease && rsecret == tok ->
          job_state = PARKED        /* the handler returns; its token may live on elsewhere */
        }
     :: skip
     fi;
#endif
     if
     :: skip                        /* the handler ended, or the process died */
     :: pick_op(op);
        if
        :: skip                     /* the token's holder (a late one after a park or a failover) */
#ifndef NO_INTRUDER
        :: atomic {                 /* or someone who read (job_id, run_lease) in the job
                                       listings and guesses the secret (never right) */
             (job_state == RUNNING || job_state == PARKED) ->
             my_lease = run_lease;
             tok = NONE
           }
#endif
        fi;
        token_call(op, my_lease, tok, st, tl)
     fi;
     atomic { my_lease = 0; tok = NONE; op = 0 }
  od
}

#ifndef NO_PARK
/* resume_callback of a parked attempt (continue_parked): receipt back to ready, run lease kept. */
active proctype resumer() {
end_idle:
  do
  :: atomic {
       job_state == PARKED ->
       job_state = AVAILABLE;
       cont = true;
       rsecret = NONE
     }
  od
}

#endif
/* rescue_attempts, one round: a running attempt whose heartbeat is stale goes back to ready. */
active proctype rescue() {
end_idle:
  atomic {
    job_state == RUNNING ->
    job_state = AVAILABLE;
    rsecret = NONE
  }
}

/* Asynchronous streaming replication: the standby catches up to the primary at any moment. */
active proctype replication() {
  byte n = 0;
end_idle:
  do
  :: atomic {
       timeline == 0 && n < REPLAYS ->
       n++;
       sb_job_state = job_state; sb_run_lease = run_lease; sb_rsecret = rsecret;
       sb_cont = cont; sb_term_count = term_count; sb_term_secret = term_secret
     }
  od
}

/* The standby is promoted: what it had not replayed is lost. */
active proctype failover() {
  atomic {
    job_state = sb_job_state; run_lease = sb_run_lease; rsecret = sb_rsecret;
    cont = sb_cont; term_count = sb_term_count; term_secret = sb_term_secret;
    timeline++
  }
}

active proctype invariants() {
  d_step {
    /* at most one terminal outcome per job (on the current timeline) */
    assert(term_count <= 1);
    assert(TERMINAL(job_state) == (term_count == 1));
    /* an open receipt has a secret; no other state has one */
    assert((job_state == RUNNING || job_state == PARKED) == (rsecret != NONE));
    assert(!cont || job_state == AVAILABLE);
    assert(rsecret <= next_secret)
  }
}

init {
  atomic {
    run worker();
    run worker()
  }
}
