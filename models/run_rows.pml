/*
 * run_rows.pml -- SPIN model of run rows (schema 30; SQL in
 * adapters/postgres/sql/0030_run_rows.sql: claim_attempts, release_from_run, cancel_job;
 * models/README.md, "run_rows.pml").
 *
 * A bulk enqueue (COPY) stores its batch of fresh jobs as ONE `runs` row: (queue, priority,
 * job_ids ascending, taken = 0). The jobs job_ids[taken+1..] are available inside the run and
 * have no row of their own; other jobs wait as `ready` rows. A job is in exactly one place:
 * untaken in a run, a ready row, an open attempt, or terminal.
 *
 * job_ids is ascending and only ever loses ids, so the model keeps it as a bit set of job ids
 * (run_set) and `taken` as the count it is: job_ids[1:taken] are the `taken` lowest ids of the
 * set, job_ids[taken+1:] the others. Cutting an untaken id out keeps the taken prefix and shifts
 * the later ids down, which is what clearing its bit does.
 *
 * Processes (each atomic step is one SQL statement or one commit):
 *   producer     the COPY's transaction: the run row of jobs 1..RUN_LEN becomes visible at its
 *                commit (one step). Job NJOBS (= RUN_LEN + 1) waits as a ready row from the start.
 *   claimer (x2) claim_attempts: locks the run row FOR UPDATE SKIP LOCKED (a run the other claim
 *                holds is skipped: no run this time; or, migration 31, the claim waits for the
 *                lock, bounded, and then finds the row's latest version or none), reads `taken` from the locked (latest)
 *                version, offers job_ids[taken+1 .. taken+TAKE], locks ready rows SKIP LOCKED, and
 *                takes a prefix of the offer and some of those ready rows, at most TAKE in all
 *                (which ones is a free choice: priorities are not modelled). At its commit it moves
 *                `taken` by the prefix (or deletes the run row when it is used up), deletes the
 *                ready rows it took and opens one attempt per job with a new run lease. The run
 *                row's lock is held from the lock to the commit. Then, as the worker, it completes
 *                each job it took (complete_batch), guarded by (job_id, run_lease) being open.
 *   cancel       cancel_job(j) of one job, in rounds (CANCEL_ROUNDS, then 40001): release_from_run's
 *                SELECT ... FOR UPDATE finds j untaken on its snapshot, waits for a claim holding
 *                the run row, checks again on the latest version, cuts j out (the row deleted when
 *                nothing untaken is left) and puts j into ready, from where the same transaction
 *                deletes it and records 'cancelled'. A job in ready: the DELETE waits for a claim's
 *                lock on the row and checks again. A job a claim took (also one taken under the
 *                cut): cancel_attempt(j, run_lease), guarded; if that attempt closed under it, it
 *                looks again.
 *   rescue       rescue_attempts (RESCUES times): closes an open attempt and puts the job back as
 *                a ready row with the same run lease (the next claim opens lease + 1).
 *   invariants   ghost observer: the safety invariants in every reachable state.
 *   quiescence   ghost observer: end-state checks once nothing else can move.
 *
 * Mutants (models/check.sh --model run_rows --mutant NAME); each line is read by check.sh:
 * @mutant unlocked_run_claim -DMUTANT_UNLOCKED_CLAIM
 *         the claim reads the run row without locking it: its offer comes from a `taken` that
 *         may be stale, and its write (taken := what it read + what it took, or the delete) is
 *         neither held off by nor waits for the other claim's lock
 * @mutant cancel_without_recheck -DMUTANT_NO_RECHECK
 *         cancel decides that j is untaken on its snapshot, before it waits for the run row's
 *         lock, and after the wait cuts j out (a no-op when j is no longer untaken) and cancels
 *         it without checking again
 * @mutant used_up_run_kept -DMUTANT_KEEP_USED_UP
 *         a claim that takes the last untaken jobs of a run moves `taken` to the run's length
 *         instead of deleting the row
 */

#ifndef RUN_LEN
#define RUN_LEN 3              /* jobs 1..RUN_LEN are the COPY's batch (2 or 3) */
#endif
#define NJOBS (RUN_LEN + 1)    /* job NJOBS waits as a plain ready row from the start */
#ifndef TAKE
#define TAKE 2                 /* claim_attempts(max_jobs): the most one claim takes */
#endif
#ifndef RESCUES
#define RESCUES 1              /* rescues that find an attempt stale */
#endif
#ifndef CANCEL_ROUNDS
#define CANCEL_ROUNDS 2        /* rounds of cancel_job before it gives up (40001) */
#endif
#if RUN_LEN < 2 || RUN_LEN > 3
#error RUN_LEN must be 2 or 3
#endif

#define BIT(j) (1 << (j))

#define NONE      0            /* outcome[j] */
#define COMPLETED 1
#define CANCELLED 2

/* ---- committed database state ---- */
byte run_set = 0;              /* the run row's job_ids as a bit set; 0: no run row */
byte taken = 0;                /* job_ids[1:taken] were claimed */
byte run_lock = 0;             /* the claimer (1 or 2) whose transaction holds the run row's lock */
byte ready_set = 0;            /* jobs with a ready row */
byte ready_locked = 0;         /* ready rows a claim's transaction holds (FOR UPDATE) */
byte lease[NJOBS + 1];         /* the job's newest run lease (0: never claimed) */
byte att[NJOBS + 1];           /* the run lease of the job's open attempt; 0: none */
byte outcome[NJOBS + 1];       /* terminal record of job j: NONE, COMPLETED, CANCELLED */

/* ---- ghost state (observers only) ---- */
bool seeded = false;           /* job NJOBS exists (init made its ready row) */
bool produced = false;         /* jobs 1..RUN_LEN exist (the COPY committed) */
byte term_count[NJOBS + 1];    /* terminal records written per job */

#define RUN_EXISTS (run_set != 0)
#define POP(s) ((((s) >> 1) & 1) + (((s) >> 2) & 1) + (((s) >> 3) & 1))
#define LEN POP(run_set)                       /* cardinality(job_ids) */
#define DROP1(s) ((s) & ((s) - 1))             /* without its lowest id */
#define DROP(s, n) (((n) == 0) -> (s) : (((n) == 1) -> DROP1(s) : (((n) == 2) -> DROP1(DROP1(s)) : 0)))
#define UNTAKEN_SET DROP(run_set, taken)       /* job_ids[taken+1:] */
#define UNTAKEN(j) ((UNTAKEN_SET & BIT(j)) != 0)
#define READY(j) ((ready_set & BIT(j)) != 0)
#define FREE_READY (ready_set & ~ready_locked)
#define AVAILABLE (RUN_EXISTS && taken < LEN || FREE_READY != 0)
#define EXISTS(j) ((j) == NJOBS && seeded || (j) < NJOBS && produced)
#if NJOBS > 3
#define ANY_OPEN (att[1] != 0 || att[2] != 0 || att[3] != 0 || att[4] != 0)
#else
#define ANY_OPEN (att[1] != 0 || att[2] != 0 || att[3] != 0)
#endif
#define LOWEST(s) (((s) & BIT(1)) -> 1 : (((s) & BIT(2)) -> 2 : (((s) & BIT(3)) -> 3 : 4)))

inline delete_run() {
  run_set = 0;
  taken = 0
}

/* a terminal record for job j (its attempt, if it had one, closed by the caller) */
inline record(j, what) {
  assert(outcome[j] == NONE);          /* property 2: at most one terminal outcome */
  outcome[j] = what;
  term_count[j]++
}

/* a ready row of job j: a claim may lock it (SKIP LOCKED) and take it, within TAKE */
inline offer_ready(j) {
  if
  :: p + nr < TAKE && (FREE_READY & BIT(j)) ->
     ready_locked = ready_locked | BIT(j);
     mine = mine | BIT(j);
     nr++
  :: skip
  fi
}

/* at the claim's commit: job j's ready row (if it took one) deleted, an attempt opened */
inline open_attempt(j) {
  if
  :: mine & BIT(j) ->
     /* property 1: no second open attempt; property 2: a terminal job is never claimed */
     assert(att[j] == 0 && outcome[j] == NONE);
     lease[j]++;
     att[j] = lease[j];
     my_lease[j] = lease[j]
  :: else -> skip
  fi
}

/* property 1 (property 3: never in no place): a job is in exactly one place; property 2:
   nothing after a terminal record */
inline one_place(j) {
  assert((EXISTS(j) -> (UNTAKEN(j) + READY(j) + (att[j] != 0) + (outcome[j] != NONE) == 1)
                     : ((run_set & BIT(j)) == 0 && !READY(j) && att[j] == 0 && outcome[j] == NONE)));
  assert(term_count[j] == (outcome[j] != NONE));
  assert(att[j] <= lease[j])
}

active proctype producer() {
  atomic {                             /* the COPY's transaction commits: specs and the run row */
    run_set = BIT(RUN_LEN + 1) - 2;    /* job_ids = {1 .. RUN_LEN} */
    taken = 0;
    produced = true
  }
}

proctype claimer(byte me) {
  bool got = false;            /* the claim read the run row (in the protocol: it locked it) */
  byte t = 0;                  /* `taken` as the claim read it */
  byte p = 0;                  /* how many of the offer it takes (a prefix) */
  byte nr = 0;                 /* ready rows it takes */
  byte from_run = 0;           /* the prefix it takes, as a bit set */
  byte mine = 0;               /* every job it took */
  byte my_lease[NJOBS + 1];    /* the run lease of each job it took (its tokens) */
  byte j = 0;
end_idle:
  do
  :: atomic {
       AVAILABLE ->
       if                              /* the run row: FOR UPDATE SKIP LOCKED, latest version */
#ifdef MUTANT_UNLOCKED_CLAIM
       :: RUN_EXISTS ->                /* read without a lock */
#else
       :: RUN_EXISTS && run_lock == 0 ->
          run_lock = me;
#endif
          got = true;
          t = taken
#ifndef MUTANT_UNLOCKED_CLAIM
       :: RUN_EXISTS && run_lock != 0 && run_lock != me ->
          /* every run held (migration 31): the claim waits for the row's lock (atomicity is
             lost while it blocks) and reads the row's latest version, or finds it deleted */
          (run_lock == 0);
          if
          :: RUN_EXISTS -> run_lock = me; got = true; t = taken
          :: else -> skip
          fi
#endif
       :: !RUN_EXISTS || run_lock != 0 -> skip
                                       /* no run row, or the other claim holds it and this one
                                          passes it by (or its wait timed out): no run */
       fi;
       if                              /* a prefix of the offer job_ids[t+1 .. t+TAKE] */
       :: p = 0
       :: got && LEN > t -> p = 1
       :: got && LEN > t + 1 && TAKE > 1 -> p = 2
       fi;
       from_run = DROP(run_set, t);             /* job_ids[t+1:] as it read them ... */
       from_run = from_run & ~DROP(from_run, p); /* ... and their first p */
       offer_ready(1);                 /* ready rows, FOR UPDATE SKIP LOCKED */
       offer_ready(2);
       offer_ready(3);
#if NJOBS > 3
       offer_ready(4);
#endif
       nr = 0
     };
     atomic {                          /* the claim's writes; COMMIT */
       if
       :: p > 0 ->
#if defined(MUTANT_UNLOCKED_CLAIM)
          if
          :: RUN_EXISTS ->
             taken = t + p;            /* what it read, plus what it took */
             if
             :: taken >= LEN -> delete_run()
             :: else -> skip
             fi
          :: else -> skip              /* the other claim deleted the row: nothing to update */
          fi;
#elif defined(MUTANT_KEEP_USED_UP)
          taken = taken + p;
#else
          assert(run_lock == me && taken == t);
          if
          :: taken + p == LEN -> delete_run()
          :: else -> taken = taken + p
          fi;
#endif
          mine = mine | from_run
       :: else -> skip
       fi;
       ready_set = ready_set & ~mine;  /* the ready rows it took (and locked) are deleted */
       ready_locked = ready_locked & ~mine;
       open_attempt(1);
       open_attempt(2);
       open_attempt(3);
#if NJOBS > 3
       open_attempt(4);
#endif
       if
       :: run_lock == me -> run_lock = 0
       :: else -> skip
       fi;
       got = false;
       t = 0;
       p = 0;
       from_run = 0
     };
     do                                /* the worker completes each job, guarded */
     :: mine != 0 ->
        atomic {
          j = LOWEST(mine);
          if
          :: att[j] == my_lease[j] ->  /* (j, its run lease) is the open attempt */
             att[j] = 0;
             record(j, COMPLETED)
          :: else -> skip              /* rescued or cancelled meanwhile: stale, no write */
          fi;
          mine = mine & ~BIT(j);
          my_lease[j] = 0;
          j = 0
        }
     :: else -> break
     od
  od
}

#ifndef NO_CANCEL             /* -DNO_CANCEL: no cancel_job at all (for exploring by hand) */
active
#endif
proctype cancel() {
  byte j = 0;
  byte l = 0;                  /* the run lease cancel_attempt names */
  byte round = 0;
  byte path = 0;               /* 1: inside the run; 2: a ready row; 3: an open attempt; 0: none */
  atomic {                     /* the operator cancels a job of the batch or the ready one */
    produced ->
    if
    :: j = 1
    :: j = 2
    :: j = NJOBS
#if NJOBS > 3
    :: j = 3
#endif
    fi
  };
  do
  :: round < CANCEL_ROUNDS ->
     atomic {                  /* where j is, as each statement's snapshot finds it */
       round++;
       if
       :: UNTAKEN(j) -> path = 1       /* release_from_run's SELECT matches on its snapshot */
       :: READY(j) -> path = 2
       :: att[j] != 0 -> path = 3; l = att[j]
       :: else -> path = 0; round = CANCEL_ROUNDS   /* terminal: cancel_job returns false */
       fi
     };
     if
     :: path == 1 ->
        atomic {               /* FOR UPDATE: waits for a claim holding the run row, then ... */
          run_lock == 0 ->
#ifdef MUTANT_NO_RECHECK
          if                   /* ... cuts j out and cancels it on the snapshot's word */
          :: UNTAKEN(j) ->
             run_set = run_set & ~BIT(j);
             if
             :: taken == LEN -> delete_run()
             :: else -> skip
             fi
          :: else -> skip      /* a claim took j: the array keeps it in the taken prefix */
          fi;
          record(j, CANCELLED);
          round = CANCEL_ROUNDS;
          path = 0
#else
          if                   /* ... checks again on the latest version */
          :: UNTAKEN(j) ->
             /* job_ids := job_ids[1:taken] || array_remove(job_ids[taken+1:], j) */
             run_set = run_set & ~BIT(j);
             if
             :: taken == LEN -> delete_run()   /* nothing untaken left */
             :: else -> skip
             fi;
             /* INSERT INTO ready; cancel_job's DELETE of it and its 'cancelled' record; COMMIT */
             record(j, CANCELLED);
             round = CANCEL_ROUNDS;
             path = 0
          :: else ->           /* a claim took it meanwhile: NOT FOUND */
             if
             :: att[j] != 0 -> path = 3; l = att[j]
             :: else -> path = 0               /* closed already: look again */
             fi
          fi
#endif
        }
     :: path == 2 ->
        atomic {               /* DELETE FROM ready: waits for a claim's lock, checks again */
          (ready_locked & BIT(j)) == 0 ->
          if
          :: READY(j) ->
             ready_set = ready_set & ~BIT(j);
             record(j, CANCELLED);
             round = CANCEL_ROUNDS;
             path = 0
          :: else ->           /* a claim took it */
             if
             :: att[j] != 0 -> path = 3; l = att[j]
             :: else -> path = 0
             fi
          fi
        }
     :: else -> skip
     fi;
     if
     :: path == 3 ->
        atomic {               /* cancel_attempt(j, l), guarded */
          if
          :: att[j] == l ->
             att[j] = 0;
             record(j, CANCELLED);
             round = CANCEL_ROUNDS
          :: else -> skip      /* closed under us (completed or rescued): look again */
          fi;
          path = 0;
          l = 0
        }
     :: else -> skip
     fi
  :: else -> break
  od
}

active proctype rescue() {
  byte n = 0;
  byte j = 0;
end_idle:
  do
  :: atomic {                  /* an open attempt whose heartbeat is stale (free choice) */
       n < RESCUES && ANY_OPEN ->
       if
       :: att[1] != 0 -> j = 1
       :: att[2] != 0 -> j = 2
       :: att[3] != 0 -> j = 3
#if NJOBS > 3
       :: att[4] != 0 -> j = 4
#endif
       fi;
       att[j] = 0;             /* closed as rescued */
       ready_set = ready_set | BIT(j);   /* back to ready with the same run lease */
       n++;
       j = 0
     }
  od
}

/* Safety invariants, checked in every reachable state (the d_step may run at any point). */
active proctype invariants() {
  d_step {
    /* property 4: taken never exceeds the length, and a used-up run row does not remain */
    assert(taken <= LEN);
    assert(RUN_EXISTS -> taken < LEN : taken == 0);
    assert((ready_locked & ~ready_set) == 0);
    one_place(1);
    one_place(2);
    one_place(3);
#if NJOBS > 3
    one_place(4);
#endif
  }
}

/* End-state checks, once no other process can move. */
active proctype quiescence() {
  timeout ->
  d_step {
    assert(run_lock == 0 && ready_locked == 0);
    /* property 3: every job is terminal or still waiting */
    assert(outcome[1] != NONE || UNTAKEN(1) || READY(1));
    assert(outcome[2] != NONE || UNTAKEN(2) || READY(2));
    assert(outcome[3] != NONE || UNTAKEN(3) || READY(3));
#if NJOBS > 3
    assert(outcome[4] != NONE || UNTAKEN(4) || READY(4));
#endif
  }
}

init {
  atomic {
    ready_set = BIT(NJOBS);
    seeded = true;
    run claimer(1);
    run claimer(2)
  }
}
