/*
 * caller_finalization.pml -- SPIN model of tenure's caller-owned finalization protocol
 * (docs/design.md sections 1, 3 and 6; SQL in adapters/postgres/sql/0001_base.sql, 0002_callbacks.sql).
 *
 * One job, a bounded number of claims (run leases 1..MAX_LEASE), two workers running a
 * caller-owned handler, one maintenance rescuer, one admin cancel. Every process below stands for
 * one SQL function (or one client step) and is mapped to it in its comment.
 *
 *   worker        claim_attempts (claim to running, run_lease + 1); the caller-owned handler:
 *                 BEGIN, business write, complete_job(token) in the same transaction, then COMMIT,
 *                 ROLLBACK, crash, or COMMIT whose acknowledgement is lost; afterwards the
 *                 runtime's reconciliation: a receipt whose COMMIT the bridge saw answered
 *                 (complete_and_commit) is accepted as it is; any other exit reads
 *                 attempt_evidence, and fail_attempt runs when the attempt is still open.
 *   rescue        rescue_attempts (FOR UPDATE SKIP LOCKED: a running attempt whose row is locked
 *                 by an open completion is skipped; heartbeat staleness is nondeterministic).
 *   admin_cancel  cancel_job: cancels an available job at once; for a running one it reads the
 *                 live run lease, then cancel_attempt(job, lease) waits for the row lock and
 *                 re-checks (READ COMMITTED re-evaluation); if the attempt closed under it, it
 *                 looks again (bounded rounds, then gives up with 40001).
 *   invariants    ghost observer: checks the safety invariants in every reachable state.
 *   quiescence    ghost observer: end-state checks once nothing else can move.
 *
 * Database transactions. Global variables hold the COMMITTED state. A caller transaction keeps
 * its writes in process-local variables (business_pending, completion_pending) until COMMIT
 * applies them in one atomic step, or ROLLBACK / a crash discards them. The guarded DELETE of the
 * receipt in complete_job takes the attempt's row lock (row_locked), held until the caller's
 * transaction ends. Other writers of a running attempt (rescue, cancel_attempt, fail_attempt) are
 * single atomic steps enabled only while the lock is free, and they evaluate their guard on the
 * committed state at that moment: that is PostgreSQL's wait-then-recheck of the updated row.
 * claim_attempts and cancel of an available job touch the ready row, which complete_job does not
 * lock, so they do not look at row_locked.
 *
 * Build the broken variant with `spin -DMUTANT`: complete_job then drops its guard (it does not
 * check that the job is running under the token's run lease) and the checks must fail.
 * Mutants (models/check.sh --mutant NAME); each line is read by check.sh:
 * @mutant guardless -DMUTANT
 *         complete_job without its guard (no check of the token's run lease or the job's state)
 * @mutant trust_receipt -DTRUST_RECEIPT
 *         the runtime accepts any receipt without reading evidence, also one of complete_in_tx
 *         whose transaction the handler then rolled back
 * @mutant mislabelled_commit -DMISLABELLED_COMMIT
 *         the bridge marks a receipt committed when its transaction rolled back
 */

/* job states (tenure.jobs.state); scheduled/retryable/waiting_external are abstracted into
   AVAILABLE (retry backoff) or left out (callbacks). */
#define AVAILABLE  0
#define RUNNING    1
#define COMPLETED  2
#define CANCELLED  3
#define FAILED     4
#define TERMINAL(s) ((s) >= COMPLETED)

#ifndef MAX_LEASE
#define MAX_LEASE  3    /* claims (run leases) explored: 1..MAX_LEASE */
#endif
#ifndef RESCUES
#define RESCUES    2    /* rescue_attempts rounds that find the job stale */
#endif
#ifndef CANCEL_ROUNDS
#define CANCEL_ROUNDS 2 /* cancel_job look-again rounds (5 in SQL; 2 exercise the re-check) */
#endif

/* handler exit as seen by the runtime */
#define OUT_RECEIPT   1 /* a receipt of complete_in_tx: the statement ran; its transaction may
                           since have committed, rolled back, or lost its COMMIT's answer */
#define OUT_ERROR     2 /* error, exception, TN001, rollback, or COMMIT with a lost ack */
#define OUT_COMMITTED 3 /* a receipt of complete_and_commit: the server answered its COMMIT */

/* ---- committed database state of the one job ---- */
byte job_state  = AVAILABLE;
byte run_lease  = 0;      /* monotonic; +1 on every claim, never goes back */
bool row_locked = false;  /* receipt row lock held by an open caller transaction */
byte term_lease = 0;      /* run_lease written in the terminal record (done row) */

/* ---- ghost state (observers only; no SQL counterpart) ---- */
byte term_count = 0;                    /* terminal transitions committed for the job */
bool business_committed[MAX_LEASE + 1]; /* attempt L's business write is committed */
bool accepted[MAX_LEASE + 1];           /* reconciliation accepted attempt L as completed */

/* Record a terminal outcome (done row) with the current run lease. */
inline close_terminal(st) {
  job_state = st;
  term_lease = run_lease;
  term_count++
}

/*
 * A worker process: claim_attempts, then the caller-owned handler for the claimed attempt, then
 * the runtime's reconciliation of the token. After a crash the worker process restarts with no
 * memory of the attempt (its row is left for rescue). Leaves at end_idle when nothing is
 * claimable any more.
 */
proctype worker() {
  byte my = 0;                      /* run lease named by this worker's finalization token */
  bool business_pending = false;    /* uncommitted business write in the caller transaction */
  bool completion_pending = false;  /* uncommitted completion (receipt deleted, done row) */
  byte outcome = 0;

end_idle:
  do
  :: atomic {                       /* claim_attempts: ready -> receipts, run_lease + 1 */
       job_state == AVAILABLE && run_lease < MAX_LEASE ->
       run_lease++;
       job_state = RUNNING;
       my = run_lease
     }

     /* ---- caller-owned handler (provider call outside any transaction is abstracted) ---- */
     if
     :: outcome = OUT_ERROR         /* handler fails before opening its transaction */
     :: business_pending = true;    /* BEGIN; business write (e.g. UPDATE orders SET paid) */
        atomic {                    /* complete_job(token my) in the same transaction */
          !row_locked ->
#ifdef MUTANT
          row_locked = true;        /* MUTANT: no guard, the completion always "applies" */
          completion_pending = true
#else
          if
          :: job_state == RUNNING && run_lease == my ->
               row_locked = true;   /* guarded DELETE of receipt (job, my): row lock */
               completion_pending = true
          :: else ->                /* matches nothing: RAISE TN001, transaction aborted */
               business_pending = false;
               outcome = OUT_ERROR
          fi
#endif
        }
        if
        :: completion_pending ->
           if
           :: atomic {              /* COMMIT: business write and completion become visible */
                /* property 3: a completion by token L is recorded only while L is live */
                assert(job_state == RUNNING && run_lease == my);
                business_committed[my] = true;
                close_terminal(COMPLETED);
                row_locked = false;
                business_pending = false;
                completion_pending = false
              }
              if
              :: outcome = OUT_COMMITTED /* complete_and_commit saw the server's answer */
              :: outcome = OUT_RECEIPT   /* complete_in_tx, then the handler's own COMMIT */
              :: outcome = OUT_ERROR     /* server committed, client saw a connection error */
              fi
           :: atomic {              /* ROLLBACK (handler error/exception after complete_in_tx) */
                row_locked = false;
                business_pending = false;
                completion_pending = false;
                if
                :: outcome = OUT_ERROR
                :: outcome = OUT_RECEIPT /* the handler returns complete_in_tx's receipt anyway */
#ifdef MISLABELLED_COMMIT
                :: outcome = OUT_COMMITTED /* MUTANT: a rolled-back COMMIT said to be answered */
#endif
                fi
              }
           :: atomic {              /* crash before COMMIT: the server aborts the transaction */
                row_locked = false;
                business_pending = false;
                completion_pending = false;
                outcome = 0;
                my = 0
              };
              goto restart          /* the process is gone: no reconciliation */
           fi
        :: else -> skip             /* TN001 */
        fi
     fi;

     /* ---- a witnessed COMMIT is the evidence: accepted without a read ---- */
     if
#ifdef TRUST_RECEIPT
     :: outcome == OUT_COMMITTED || outcome == OUT_RECEIPT ->
        accepted[my] = true;        /* MUTANT: any receipt taken at its word */
        goto restart
#else
     :: outcome == OUT_COMMITTED ->
        assert(job_state == COMPLETED && term_lease == my); /* what a read would find */
        accepted[my] = true;
        goto restart
#endif
     :: else -> skip
     fi;

     /* ---- reconciliation of token my against durable evidence (attempt_evidence) ---- */
     if
     :: atomic { job_state == COMPLETED && term_lease == my -> /* 1. completed by this token */
          assert(business_committed[my]);
          accepted[my] = true
        }
     :: atomic { job_state == RUNNING && run_lease == my ->    /* 2. still open */
          assert(outcome != OUT_COMMITTED)  /* a committed receipt is never read for */
        }
        /* ordinary retry/fail policy: fail_attempt(job, my), guarded, waits for the row lock */
        atomic {
          !row_locked ->
          if
          :: job_state == RUNNING && run_lease == my ->
             if
             :: job_state = AVAILABLE          /* retryable (backoff abstracted) */
             :: close_terminal(FAILED)         /* attempts spent / permanent */
             fi
          :: else -> skip                      /* stale: closed under us, change nothing */
          fi
        }
     :: else ->                                 /* 3. closed by something else: stale */
        assert(outcome != OUT_COMMITTED)
     fi;
restart:
     atomic { outcome = 0; my = 0 }
  od
}

/* rescue_attempts: closes a running attempt whose heartbeat is stale. SKIP LOCKED: an attempt
   whose row is locked by an open completion is skipped (the completion wins). */
active proctype rescue() {
  byte n = 0;
end_idle:
  do
  :: atomic {
       n < RESCUES && job_state == RUNNING && !row_locked ->
       n++;
       if
       :: job_state = AVAILABLE        /* attempts remain: ready again, same run lease */
       :: close_terminal(FAILED)       /* attempts spent: failed (or dead-lettered) */
       fi
     }
  od
}

/* cancel_job(job_id), run once by an admin at any moment. */
active proctype admin_cancel() {
  byte round = 0;
  byte seen = 0;
  do
  :: round < CANCEL_ROUNDS ->
     round++;
     atomic {
       if
       :: job_state == AVAILABLE ->    /* DELETE FROM ready ... -> done 'cancelled' */
          close_terminal(CANCELLED);
          goto done
       :: job_state == RUNNING ->      /* SELECT run_lease FROM receipts (no lock) */
          seen = run_lease
       :: else -> goto done            /* already finished: returns false */
       fi
     }
     atomic {                          /* cancel_attempt(job, seen): waits for the row lock */
       !row_locked ->
       if
       :: job_state == RUNNING && run_lease == seen ->
          close_terminal(CANCELLED);
          goto done
       :: else -> seen = 0             /* the attempt closed under us: look again */
       fi
     }
  :: else -> break                     /* gave up: SQLSTATE 40001, the caller may retry */
  od;
done:
  skip
}

/* Safety invariants, checked in every reachable state (the single assert may fire anywhere). */
active proctype invariants() {
  byte l;
  d_step {
    /* property 2: at most one terminal outcome per job */
    assert(term_count <= 1);
    assert(TERMINAL(job_state) == (term_count == 1));
    l = 1;
    do
    :: l <= MAX_LEASE ->
       /* property 1: a committed business write of attempt L implies the job's terminal record
          is completed by L; and (caller-owned) a completion by L implies L's business write */
       assert(!business_committed[l] || (job_state == COMPLETED && term_lease == l));
       assert(!accepted[l] || business_committed[l]);
       l++
    :: else -> break
    od;
    assert(job_state != COMPLETED || business_committed[term_lease]);
    /* property 3 (state form): the terminal record names an attempt that was opened */
    assert(term_lease <= run_lease);
    l = 0
  }
}

/* End-state checks, once no other process can move. */
active proctype quiescence() {
  timeout ->
  assert(!row_locked);                 /* no caller transaction left open */
  assert(TERMINAL(job_state) == (term_count == 1))
}

init {
  atomic {
    run worker();
    run worker()
  }
}
