/*
 * leadership.pml -- SPIN model of the maintenance leadership lease and its fencing
 * (docs/design.md section 5, "Maintenance"; SQL in adapters/postgres/sql/0007_leader_lease.sql,
 * acquire_leadership() and maintain() as replaced last in 0027_renewal_beside_the_pass.sql).
 *
 * The lease is one row (holder, term, expires_at). maintain(holder, term) is the leader-only
 * pass: it locks the row FOR KEY SHARE and goes on only if (holder, term) is the row's and
 * unexpired (else TN004, nothing changed), then promotes, enqueues due schedule slots, rescues and
 * prunes in the same transaction. acquire_leadership renews its holder's unexpired lease (same
 * term) by an UPDATE of expires_at alone, which does not wait for that lock; answers NULL at once
 * for another holder's unexpired lease; and takes an expired one (term + 1) only under FOR UPDATE,
 * which waits until every pass holding the key-share lock has committed. release_leadership ends
 * the holder's term now, also without waiting. A runtime renews and releases from one session
 * while its pass runs on another, so a leader may renew or release in the middle of its own pass.
 *
 * Processes (each step is one SQL statement or one atomic server action):
 *   leader (x2)  holders 1 and 2 (names unique to a runtime instance): acquire_leadership,
 *                maintain with the term it last obtained, release_leadership. Between any two
 *                steps it may freeze for as long as it likes (GC pause, SIGSTOP, a VM stall):
 *                a frozen leader wakes and calls maintain with a term it lost meanwhile.
 *   clock        the server's clock: the lease expires (renewals stopped or late), and the
 *                schedule's next slot falls due (slots 1..MAX_SLOT).
 *   replication  asynchronous streaming: the standby's copy catches up at any moment.
 *   failover     once: the standby is promoted; the primary's state becomes the standby's copy and
 *                the old primary's open transactions are gone (their passes never commit).
 *   invariants   ghost observer.
 * The pass's schedule step is enqueue_due_schedules: it locks the schedule row (SKIP LOCKED),
 * and when last_slot < the due slot it moves last_slot to that slot and enqueues its job, both
 * committed with the pass.
 *
 * Mutants (models/check.sh --model leadership --mutant NAME); each line is read by check.sh:
 * @mutant no_fence -DMUTANT_NO_FENCE -DNO_FAILOVER
 *         maintain neither checks the caller's (holder, term) nor locks the lease row (no
 *         failover either: a frozen leader is enough)
 * @mutant term_only -DMUTANT_TERM_ONLY
 *         maintain checks the term and the expiry but not the holder (caught only through a
 *         failover, which issues a term number again)
 * @mutant takeover_no_wait -DMUTANT_TAKEOVER_NO_WAIT -DNO_FAILOVER
 *         a takeover of an expired lease does not wait for the key-share lock of an open pass
 *         (as if renewal, release and takeover all changed only non-key columns unlocked)
 */

#define NOBODY 0

#ifndef MAX_TERM
#define MAX_TERM 3      /* takeovers explored: terms 1..MAX_TERM */
#endif
#ifndef PASSES
#define PASSES   2      /* maintain calls per leader */
#endif
#ifndef MAX_SLOT
#define MAX_SLOT 1      /* schedule slots that fall due */
#endif
#ifndef REPLAYS
#define REPLAYS  1      /* times the standby catches up before the failover */
#endif

/* maintain's check of the caller, on the lease row it locks FOR KEY SHARE */
#if defined(MUTANT_NO_FENCE)
#define FENCE_OK(me, t) true
#elif defined(MUTANT_TERM_ONLY)
#define FENCE_OK(me, t) (term == t && !expired)
#else
#define FENCE_OK(me, t) (holder == me && term == t && !expired)
#endif

/* ---- committed state on the current primary ---- */
byte holder = NOBODY;    /* leadership row: holder, term, expired (expires_at <= clock) */
byte term = 0;
bool expired = true;     /* the row starts expired: the first asker takes term 1 */
byte last_slot = 0;      /* schedules.last_slot */
byte enqueued = 0;       /* ghost: bit s set once slot s's job is enqueued */
byte last_pass = 0;      /* ghost: term of the last maintain pass that committed */

/* ---- the standby's copy ---- */
byte sb_holder = NOBODY;
byte sb_term = 0;
bool sb_expired = true;
byte sb_last_slot = 0;
byte sb_enqueued = 0;
byte sb_last_pass = 0;

/* ---- locks and time (not replicated) ---- */
byte share = 0;          /* passes holding the lease row FOR KEY SHARE */

/* a takeover locks the row FOR UPDATE first: it waits for every key-share lock */
#ifdef MUTANT_TAKEOVER_NO_WAIT
#define TAKEOVER_MAY_GO true
#else
#define TAKEOVER_MAY_GO (share == 0)
#endif
byte sched_lock = NOBODY;/* holder of the schedule row's lock (an open pass) */
byte due = 0;            /* the latest schedule slot that is due */
byte timeline = 0;       /* +1 at the failover */

proctype leader(byte me) {
  byte myterm = 0;       /* the term this process last obtained (0: none); may be stale */
  byte passes = 0;
  byte tl = 0;           /* timeline of the open pass */
  byte slot = 0;         /* the slot the open pass enqueues (0: none) */
  bool locked = false;   /* the open pass took the lease row FOR KEY SHARE */
end_idle:
  do
  :: atomic {            /* acquire_leadership(me, ttl) */
       if
       :: holder == me && !expired -> myterm = term             /* renewed, same term: no wait */
       :: holder != me && !expired -> myterm = 0                /* NULL at once: another holds it */
       :: expired && TAKEOVER_MAY_GO ->                         /* FOR UPDATE, then decide */
          if
          :: term < MAX_TERM ->                                 /* taken over: term + 1 */
             term++;
             holder = me;
             expired = false;
             myterm = term
          :: else -> myterm = 0                                 /* (bound of the exploration) */
          fi
       fi
     }
  :: atomic {            /* release_leadership(me, myterm) (a runtime that stops): no wait */
       myterm != 0 ->
       if
       :: holder == me && term == myterm && !expired -> expired = true
       :: else -> skip
       fi;
       myterm = 0
     }
  :: atomic {            /* maintain(me, myterm): the fence, then the pass's transaction */
       myterm != 0 && passes < PASSES ->
       passes++;
       tl = timeline;
       if
       :: FENCE_OK(me, myterm) ->
#if !defined(MUTANT_NO_FENCE)
          share++;       /* PERFORM ... FROM leadership ... FOR SHARE */
          locked = true
#else
          skip
#endif
       :: else ->        /* TN004: the runtime drops its lease; nothing changed */
          myterm = 0;
          tl = 0;
          goto next
       fi
     };
     atomic {            /* enqueue_due_schedules: FOR UPDATE SKIP LOCKED on the schedule row */
       if
       :: tl == timeline && sched_lock == NOBODY ->
          sched_lock = me;
          if
          :: last_slot < due -> slot = due   /* UPDATE ... WHERE last_slot < slot; enqueue */
          :: else -> skip                    /* the slot is taken already */
          fi
       :: else -> skip                       /* locked by another pass: skipped */
       fi
     };
     atomic {            /* the same runtime's signal session, while the pass is open */
       if
       :: holder == me && !expired -> skip                       /* renewal: same term */
       :: holder == me && term == myterm && !expired -> expired = true   /* release */
       :: true -> skip                                           /* neither */
       fi
     };
     atomic {            /* COMMIT of the pass */
       if
       :: tl == timeline ->
#ifndef NO_FENCE_ASSERTS
          /* fencing: the pass takes effect while its caller holds the current term ... */
          assert(holder == me && term == myterm);
          /* ... so passes take effect in term order, never one of an older term after a newer */
          assert(myterm >= last_pass);
#endif
          last_pass = myterm;
          if
          :: slot != 0 ->
             /* a schedule slot is enqueued at most once */
             assert((enqueued & (1 << slot)) == 0);
             enqueued = enqueued | (1 << slot);
             last_slot = slot
          :: else -> skip
          fi;
          share = (locked -> share - 1 : share);
          sched_lock = (sched_lock == me -> NOBODY : sched_lock)
       :: else -> skip                       /* the old primary is gone: nothing committed */
       fi;
       tl = 0;
       slot = 0;
       locked = false
     };
next:
     skip
  od
}

/* The server's clock: a lease runs out (its holder froze, or renewals failed); a slot falls due. */
active proctype clock() {
end_idle:
  do
  :: atomic { !expired -> expired = true }
  :: atomic { due < MAX_SLOT -> due++ }
  od
}

#ifndef NO_FAILOVER
active proctype replication() {
  byte n = 0;
end_idle:
  do
  :: atomic {
       timeline == 0 && n < REPLAYS ->
       n++;
       sb_holder = holder; sb_term = term; sb_expired = expired;
       sb_last_slot = last_slot; sb_enqueued = enqueued; sb_last_pass = last_pass
     }
  od
}

active proctype failover() {
  atomic {
    holder = sb_holder; term = sb_term; expired = sb_expired;
    last_slot = sb_last_slot; enqueued = sb_enqueued; last_pass = sb_last_pass;
    share = 0;           /* the old primary's transactions (and their locks) are gone */
    sched_lock = NOBODY;
    timeline++
  }
}
#endif

active proctype invariants() {
  d_step {
    assert(holder != NOBODY || term == 0);
#ifndef NO_FENCE_ASSERTS
    assert(last_pass <= term);
#endif
    assert(last_slot <= due)
  }
}

init {
  atomic {
    run leader(1);
    run leader(2)
  }
}
