/*
 * ledger_guard.pml -- SPIN model of the ledger layout's guard (docs/storage_ledger.md §5-§6, §10;
 * models/README.md, "ledger_guard.pml"): the closure key and the attempt's advisory lock that
 * schema 24 ships, its row-wise retention, and the segment retirement proposed beside it.
 *
 * The layout: a claim appends its claim item (job, run lease) to the current segment pair; a
 * closure (completion, failure for good, rescue) goes to the segment of the claim it closes and is
 * keyed by the attempt's place in that claim, so a second closure of one attempt violates the key.
 * An attempt is open while its claim item exists and no closure has its key. The maintenance
 * leader rotates the current pair and retires an old pair whole (TRUNCATE of both partitions) once
 * every claim in it is closed: it proves that, takes ACCESS EXCLUSIVE (waiting for every open
 * transaction that read or wrote the pair), proves it again, then truncates.
 *
 * Schema 24 ships the key and the advisory lock, and retires row by row instead of by segment pair:
 * once every item of a claim is closed, the claim is settled, and retention deletes its claims row
 * when it is ripe and its closures a day later, so a late closer whose snapshot still shows the
 * attempt open meets the closure key. The leader runs both kinds of retirement here; "a day later"
 * stands for "after every transaction that read the attempt before the claim row went has ended"
 * (no transaction stays open a day: docs/storage_ledger.md, "Known gaps").
 *
 * Closers run at READ COMMITTED or at REPEATABLE READ (a caller's business transaction may be
 * either). Each reads the attempt first (the snapshot a REPEATABLE READ transaction keeps; its
 * first read also locks the pair to its commit), then takes the attempt's advisory transaction
 * lock, then checks and inserts its closure. At READ COMMITTED the check reads a new snapshot; at
 * REPEATABLE READ it reads the first one, which may be older than a closure committed by the
 * lock's previous holder; the closure key still sees that closure (unique checks read committed
 * rows whatever the snapshot) and the closer is stale. Rescue takes the advisory lock only if it is
 * free (pg_try_advisory_xact_lock) and skips the attempt otherwise.
 *
 * Processes:
 *   worker (x2)  claims (the job's ready entry -> a claim item for run lease + 1), then completes
 *                or fails it for good in a transaction at either isolation level, or dies.
 *   rescue       closes an open attempt as rescued and appends a new ready entry (same run lease).
 *   leader       rotations and retirements of segment pairs, and the row-wise retention: a settled
 *                claim's row deleted, its closures later, bounded.
 *   invariants   ghost observer: the safety invariants in every reachable state.
 *
 * Mutants (models/check.sh --mutant NAME); each line is read by check.sh:
 * @mutant no_closure_key -DMUTANT_NO_KEY
 *         closures without their key: a REPEATABLE READ closer decides on its snapshot alone
 * @mutant pair_proof_unlocked -DMUTANT_NO_RECHECK
 *         a segment pair truncated on a proof taken before its lock (not re-checked under it)
 * @mutant closures_with_claim -DMUTANT_CLOSURES_WITH_CLAIM
 *         row-wise retention deletes a settled claim's closures together with its claims row
 * @mutant closures_forgotten_early -DMUTANT_EARLY_FORGET
 *         row-wise retention deletes the closures of a retired claim while a transaction that read
 *         the attempt before the retirement is still open
 */

#define SEGS 2                 /* segment pairs: a ring of two (current and previous) */
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
bool ready = true;             /* an unclaimed ready row exists (carries ready_lease) */
byte ready_lease = 0;          /* the run lease the ready row carries; a claim issues + 1 */
byte cur = 0;                  /* current segment pair: new claims go to it */
byte claims[SEGS];             /* claim items per pair, as a bit set of run leases */
byte closures[SEGS];           /* closure rows per pair, as a bit set of run leases (the key) */
byte claim_seg[MAX_LEASE + 1]; /* the pair of each run lease's claim (its claim_id's range) */
byte users[SEGS];              /* open transactions holding a lock on a pair (read or write) */
bool excl[SEGS];               /* ACCESS EXCLUSIVE held on a pair (retirement) */
bool attempt_lock[MAX_LEASE + 1]; /* advisory transaction lock of an attempt */
bool retired[MAX_LEASE + 1];   /* row-wise retention deleted the claim's row */

/* ---- ghost state (observers only; no SQL counterpart) ---- */
bool claim_in_flight = false;  /* a claim transaction took the ready row and has not committed */
byte issued = 0;               /* highest run lease a committed claim issued */
byte terminal = 0;             /* terminal outcomes committed (completed or failed) */
byte readers[MAX_LEASE + 1];   /* open closer transactions that have read the attempt */

#define CLAIMED(l) (((claims[0] | claims[1]) & BIT(l)) != 0)
#define CLOSED(l) (((closures[0] | closures[1]) & BIT(l)) != 0)
#define OPEN(l) (CLAIMED(l) && !CLOSED(l))
/* a pair holds nothing live: every claim in it is closed (its closures are in the same pair) */
#define PAIR_DEAD(k) ((claims[k] & ~closures[k]) == 0)
/* the closure key (claim_id, pos) is free in the attempt's pair */
#ifdef MUTANT_NO_KEY
#define KEY_FREE(k, l) true
#else
#define KEY_FREE(k, l) ((closures[k] & BIT(l)) == 0)
#endif

proctype worker() {
  byte my = 0;
  byte seg = 0;
  bool rr = false;             /* the closing transaction is REPEATABLE READ */
  bool seen = false;           /* what its check reads: the attempt is open */
end_idle:
  do
  :: atomic { ready && ready_lease < MAX_LEASE -> seg = cur };   /* the claim's partition */
     if
     :: atomic {               /* BEGIN; take the ready row (SKIP LOCKED); INSERT the claim */
          ready && !excl[seg] ->
          ready = false;
          claim_in_flight = true;
          my = ready_lease + 1;
          users[seg]++
        };
        atomic {               /* COMMIT: the claim item exists */
          claims[seg] = claims[seg] | BIT(my);
          claim_seg[my] = seg;
          issued = my;
          claim_in_flight = false;
          users[seg]--
        };
        if
        :: if
           :: rr = true
           :: rr = false
           fi;
           atomic {            /* BEGIN; the first read of the attempt: its snapshot, the pair's lock */
             !excl[seg] ->
             users[seg]++;
             readers[my]++;
             seen = OPEN(my)
           };
           atomic {            /* pg_advisory_xact_lock of the attempt */
             !attempt_lock[my] -> attempt_lock[my] = true
           };
           atomic {            /* check, INSERT the closure, COMMIT */
             if
             :: !rr -> seen = OPEN(my)   /* READ COMMITTED: a new snapshot for this statement */
             :: else -> skip             /* REPEATABLE READ: the first snapshot */
             fi;
             if
             :: seen && KEY_FREE(seg, my) ->
                closures[seg] = closures[seg] | BIT(my);
                /* the guard rule: a terminal outcome only for the attempt that is live */
                assert(my == issued);
                terminal++
             :: else -> skip             /* stale: closed under us (the key refused it), no write */
             fi;
             attempt_lock[my] = false;
             readers[my]--;
             users[seg]--
           }
        :: skip                          /* the worker dies: its attempt is left to rescue */
        fi
     :: atomic { !ready -> skip }        /* the other worker took it: the claim finds none */
     fi;
     my = 0;
     rr = false;
     seen = false
  od
}

active proctype rescue() {
  byte n = 0;
  byte l = 0;
  byte seg = 0;
end_idle:
  do
  :: atomic {                            /* the scan finds an open attempt (heartbeat stale) */
       n < RESCUES && issued > 0 && OPEN(issued) && !excl[claim_seg[issued]] ->
       n++;
       l = issued;
       seg = claim_seg[l];
       users[seg]++
     };
     if
     :: atomic { !attempt_lock[l] -> attempt_lock[l] = true };   /* pg_try_advisory_xact_lock: won */
        atomic {                         /* the closure and a new ready row, one commit */
          if
          :: OPEN(l) && KEY_FREE(seg, l) ->
             closures[seg] = closures[seg] | BIT(l);
             assert(!ready && !claim_in_flight);
             ready = true;
             ready_lease = l
          :: else -> skip                /* closed meanwhile: stale, no write */
          fi;
          attempt_lock[l] = false;
          users[seg]--
        }
     :: atomic { attempt_lock[l] -> users[seg]-- }   /* a closer holds it: skipped this pass */
     fi
  od
}

active proctype leader() {
  byte steps = 0;
  byte k = 0;
  byte l = 0;
  bool proved = false;
  do
  :: steps < LEADER_STEPS ->
     steps++;
     if
     :: cur = 1 - cur                    /* rotate: new claims go to the other pair */
     :: k = 1 - cur;                     /* retire the previous pair */
        proved = PAIR_DEAD(k);           /* the proof, read without a lock */
        if
        :: proved ->
           atomic { users[k] == 0 -> excl[k] = true };   /* LOCK ... ACCESS EXCLUSIVE */
           atomic {
#ifndef MUTANT_NO_RECHECK
             proved = PAIR_DEAD(k);      /* proved again under the lock */
#endif
             if
             :: proved ->                /* TRUNCATE both partitions */
                claims[k] = 0;
                closures[k] = 0
             :: else -> skip             /* a late claim landed: keep the pair */
             fi;
             excl[k] = false
           }
        :: else -> skip                  /* an attempt in it is open: not yet */
        fi
     :: l = 1;                           /* row-wise retention of a settled claim (any one) */
        do
        :: l < MAX_LEASE -> l++
        :: break
        od;
        atomic {
          if
          :: CLAIMED(l) && CLOSED(l) && !retired[l] ->   /* settled, and ripe: its row deleted */
             claims[claim_seg[l]] = claims[claim_seg[l]] & ~BIT(l);
             retired[l] = true;
#ifdef MUTANT_CLOSURES_WITH_CLAIM
             closures[claim_seg[l]] = closures[claim_seg[l]] & ~BIT(l);
#endif
             skip
          :: else -> skip
          fi
        }
     :: l = 1;                           /* a day later: the retired claim's closures deleted */
        do
        :: l < MAX_LEASE -> l++
        :: break
        od;
        atomic {
          if
#ifdef MUTANT_EARLY_FORGET
          :: retired[l] && CLOSED(l) ->
#else
          :: retired[l] && CLOSED(l) && readers[l] == 0 ->
#endif
             closures[claim_seg[l]] = closures[claim_seg[l]] & ~BIT(l)
          :: else -> skip
          fi
        }
     fi;
     proved = false;
     k = 0;
     l = 0
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
