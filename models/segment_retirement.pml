/*
 * segment_retirement.pml -- SPIN model of an append-only attempt ledger whose segments are
 * retired whole (models/README.md, "segment_retirement.pml"). Not the shipped schema, which moves
 * each job's whole row between tables (docs/design.md section 4): the protocol a layout that
 * writes a job once and appends its claims and closures must keep, checked before it is built.
 *
 * The layout: a claim appends a claim row (job, run lease) to the current claim segment; a
 * completion, failure or rescue appends a closure row (job, run lease, outcome) to the current
 * closure segment. Whether an attempt is open is derived: its claim row exists in some segment
 * and no closure row names it. Nothing is updated or deleted row by row: the maintenance leader
 * moves the "current" pointer on (rotation) and retires an old segment whole (TRUNCATE of a
 * partition) once it has proved that the segment holds nothing live:
 *   - a claim segment only when every claim in it is closed (else an open attempt would vanish:
 *     neither running nor available nor finished, a lost job);
 *   - a closure segment only when none of its closures names a claim still kept (else that
 *     attempt would open again after it finished, and run or finish twice).
 * A writer resolves the current segment, then inserts into it in its own transaction; between the
 * two the leader may rotate and retire, so a late claim or closure can land in a segment whose
 * proof was taken before it. PostgreSQL's TRUNCATE takes ACCESS EXCLUSIVE on the partition: it
 * waits for every open transaction that wrote to it, and holds new writers off until it ends.
 * The leader therefore proves, takes the lock, proves again under it, and only then truncates.
 *
 * Processes:
 *   worker (x2)   claim (the job's ready entry -> a claim row for run lease + 1), then completes
 *                 (complete_batch / complete_job), fails it for good, or dies without a word.
 *                 Each write of an attempt takes the attempt's lock (an advisory transaction lock
 *                 on (job, run lease)) and checks that the attempt is open under it: the guard
 *                 rule of docs/design.md section 1, in the derived form.
 *   rescue        rescue_attempts: closes the open attempt as rescued (same lock and guard) and
 *                 appends a new ready entry with its run lease (the job is available again).
 *   leader        rotations and retirements of both segment kinds, in any order, bounded.
 *   invariants    ghost observer: checks the safety invariants in every reachable state.
 *
 * Mutants (models/check.sh --mutant NAME); each line is read by check.sh:
 * @mutant claim_proof_unlocked -DMUTANT_CLAIM_NO_RECHECK
 *         a claim segment truncated on a proof taken before its lock (not re-checked under it)
 * @mutant closure_proof_unlocked -DMUTANT_CLOSURE_NO_RECHECK
 *         a closure segment truncated on a proof taken before its lock
 * @mutant unguarded_closure -DMUTANT_UNGUARDED
 *         a completion appends its closure without checking, under the attempt's lock, that
 *         the attempt is still open
 */

#define SEGS 2                 /* segments per kind: a ring of two (current and previous) */
#ifndef MAX_LEASE
#define MAX_LEASE 3            /* run leases explored: 1..MAX_LEASE */
#endif
#ifndef RESCUES
#define RESCUES 2              /* rescues that find the attempt stale */
#endif
#ifndef LEADER_STEPS
#define LEADER_STEPS 4         /* rotations and retirements the leader attempts in all */
#endif

#define BIT(l) (1 << (l))

/* ---- committed database state of the one job ---- */
bool ready = true;             /* an unclaimed ready entry exists (carries ready_lease) */
byte ready_lease = 0;          /* the run lease the ready entry carries; a claim issues + 1 */
byte claim_cur = 0;            /* current claim segment */
byte close_cur = 0;            /* current closure segment */
byte claims[SEGS];             /* claim rows per segment, as a bit set of run leases */
byte closures[SEGS];           /* closure rows per segment, as a bit set of run leases */
byte claim_writers[SEGS];      /* open transactions that wrote to a claim segment */
byte close_writers[SEGS];      /* open transactions that wrote to a closure segment */
bool claim_excl[SEGS];         /* ACCESS EXCLUSIVE held on a claim segment (truncation) */
bool close_excl[SEGS];         /* ACCESS EXCLUSIVE held on a closure segment */
bool attempt_lock[MAX_LEASE + 1]; /* advisory transaction lock on (job, run lease) */

/* ---- ghost state (observers only; no SQL counterpart) ---- */
bool claim_in_flight = false;  /* a claim transaction took the ready entry and has not committed */
byte issued = 0;               /* highest run lease a committed claim issued */
byte terminal = 0;             /* terminal outcomes committed (completed or failed) */
byte term_lease = 0;           /* the run lease of the terminal outcome */

#define CLAIMED_ANY(l) (((claims[0] | claims[1]) & BIT(l)) != 0)
#define CLOSED_ANY(l) (((closures[0] | closures[1]) & BIT(l)) != 0)
#define OPEN(l) (CLAIMED_ANY(l) && !CLOSED_ANY(l))
/* a claim segment holds nothing live: every claim in it is closed */
#define CLAIM_SEG_DEAD(k) ((claims[k] & ~(closures[0] | closures[1])) == 0)
/* a closure segment holds nothing live: no closure in it names a claim still kept */
#define CLOSE_SEG_DEAD(j) ((closures[j] & (claims[0] | claims[1])) == 0)

/*
 * A write of attempt `l` that closes it (completion, failure, rescue) begins: resolve the current
 * closure segment, then in one transaction take the attempt's lock and the segment's writer lock.
 * The caller's next atomic step checks that the attempt is open (the guard), appends the
 * closure and commits: end_close releases both locks in that step.
 */
inline begin_close(l, seg) {
  seg = close_cur;                          /* the insert's partition, resolved first */
  atomic {                                  /* BEGIN; pg_advisory_xact_lock(job, l); INSERT */
    !attempt_lock[l] && !close_excl[seg] ->
    attempt_lock[l] = true;
    close_writers[seg]++
  }
}

inline end_close(l, seg) {
  attempt_lock[l] = false;
  close_writers[seg]--
}

/* The guard of a completion or a failure: the attempt is open under its lock. */
#ifdef MUTANT_UNGUARDED
#define FINISH_GUARD(l) true
#else
#define FINISH_GUARD(l) OPEN(l)
#endif

proctype worker() {
  byte my = 0;
  byte seg = 0;
end_idle:
  do
  :: atomic { ready && ready_lease < MAX_LEASE -> seg = claim_cur };  /* the claim's partition */
     if
     :: atomic {                            /* BEGIN; take the ready entry (SKIP LOCKED); INSERT */
          ready && !claim_excl[seg] ->
          ready = false;
          claim_in_flight = true;
          my = ready_lease + 1;
          claim_writers[seg]++
        };
        atomic {                            /* COMMIT: the claim row exists */
          claims[seg] = claims[seg] | BIT(my);
          issued = my;
          claim_in_flight = false;
          claim_writers[seg]--
        };
        if
        :: begin_close(my, seg);            /* complete, or fail for good */
           atomic {
             if
             :: FINISH_GUARD(my) ->
                closures[seg] = closures[seg] | BIT(my);
                /* the guard rule: a terminal outcome only for the attempt that is live */
                assert(my == issued);
                terminal++;
                term_lease = my
             :: else -> skip                /* stale: rescued (or retired) under us, no write */
             fi;
             end_close(my, seg)
           }
        :: skip                             /* the worker dies: its attempt is left to rescue */
        fi
     :: atomic { !ready -> skip }           /* the other worker took it: the claim finds none */
     fi;
     my = 0
  od
}

active proctype rescue() {
  byte n = 0;
  byte l = 0;
  byte seg = 0;
end_idle:
  do
  :: atomic { n < RESCUES && issued > 0 && OPEN(issued) -> n++; l = issued };
     begin_close(l, seg);
     atomic {
       if
       :: OPEN(l) ->                        /* the closure and a new ready entry, one commit */
          closures[seg] = closures[seg] | BIT(l);
          assert(!ready && !claim_in_flight);
          ready = true;
          ready_lease = l
       :: else -> skip                      /* completed meanwhile: stale, no write */
       fi;
       end_close(l, seg)
     }
  od
}

active proctype leader() {
  byte steps = 0;
  byte k = 0;
  bool proved = false;
  do
  :: steps < LEADER_STEPS ->
     steps++;
     if
     :: claim_cur = 1 - claim_cur           /* rotate claims: new claims go to the other one */
     :: close_cur = 1 - close_cur           /* rotate closures */
     :: k = 1 - claim_cur;                  /* retire the previous claim segment */
        proved = CLAIM_SEG_DEAD(k);         /* the proof, read without a lock */
        if
        :: proved ->
           atomic { claim_writers[k] == 0 -> claim_excl[k] = true };  /* LOCK ... ACCESS EXCLUSIVE */
           atomic {
#ifndef MUTANT_CLAIM_NO_RECHECK
             proved = CLAIM_SEG_DEAD(k);    /* proved again under the lock */
#endif
             if
             :: proved -> claims[k] = 0     /* TRUNCATE */
             :: else -> skip                /* a late claim landed: keep the segment */
             fi;
             claim_excl[k] = false
           }
        :: else -> skip                     /* an attempt in it is open: not yet */
        fi
     :: k = 1 - close_cur;                  /* retire the previous closure segment */
        proved = CLOSE_SEG_DEAD(k);
        if
        :: proved ->
           atomic { close_writers[k] == 0 -> close_excl[k] = true };
           atomic {
#ifndef MUTANT_CLOSURE_NO_RECHECK
             proved = CLOSE_SEG_DEAD(k);
#endif
             if
             :: proved -> closures[k] = 0
             :: else -> skip                /* a late closure of a kept claim landed */
             fi;
             close_excl[k] = false
           }
        :: else -> skip
        fi
     fi;
     proved = false;
     k = 0
  :: else -> break
  od
}

/* Safety invariants, checked in every reachable state. */
active proctype invariants() {
  byte l;
  d_step {
    /* at most one terminal outcome, and none after it: a finished job never opens again */
    assert(terminal <= 1);
    assert(terminal == 0 || (!ready && !claim_in_flight && !OPEN(issued)));
    /* no lost job: an unfinished job is available, being claimed, or has its attempt open */
    assert(terminal == 1 || ready || claim_in_flight || OPEN(issued));
    /* at most one open attempt, and it is the newest: no older attempt opens again */
    l = 1;
    do
    :: l <= MAX_LEASE ->
       assert(l == issued || !OPEN(l));
       l++
    :: else -> break
    od;
    l = 0
  }
}

init {
  atomic {
    run worker();
    run worker()
  }
}
