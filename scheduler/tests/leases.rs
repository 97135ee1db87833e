//! Leases, expiry and late joins with paused time: the scheduler's behaviour without gRPC.

use ps_core::JobSpec;
use ps_scheduler::state::SchedError;
use ps_scheduler::{Scheduler, SchedulerConfig};
use tokio::time::{Duration, advance};
use tokio_util::sync::CancellationToken;

const JOB: &str = r#"
name = "leases"
consistency = "bsp"
num_shards = 1
num_workers = 2
lease_ms = 1000
"#;

fn live(s: &Scheduler) -> Vec<(u64, bool, Vec<u32>)> {
    s.with_job("leases", |j, _| {
        j.workers
            .iter()
            .map(|(id, w)| (*id, w.live, if w.live { j.data.of(*id) } else { vec![] }))
            .collect()
    })
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_expired_worker_is_removed_and_a_late_joiner_is_served() {
    let s = Scheduler::open(SchedulerConfig::default(), CancellationToken::new()).unwrap();
    s.submit(JobSpec::from_toml(JOB).unwrap()).await.unwrap();
    let (a, _) = s.join("leases", "a", 0, "").unwrap();
    let (b, _) = s.join("leases", "b", 0, "").unwrap();
    assert_eq!(live(&s).iter().map(|w| w.2.len()).sum::<usize>(), 2);

    // `a` heartbeats, `b` does not: after one lease `b` is gone and `a` reads both parts.
    for _ in 0..6 {
        advance(Duration::from_millis(250)).await;
        s.worker_heartbeat("leases", a.worker_id, "").unwrap();
        tokio::task::yield_now().await;
    }
    let ws = live(&s);
    assert_eq!(ws[0], (a.worker_id, true, vec![0, 1]));
    assert!(!ws[1].1, "b's lease expired");
    let e = s.worker_heartbeat("leases", b.worker_id, "").unwrap_err();
    assert!(
        matches!(e, SchedError::NotMember { worker, .. } if worker == b.worker_id),
        "{e}"
    );

    // `a`, alone now, reports three clocks; a late joiner starts at the minimum clock, 3
    // (not at 0, where everyone started), and takes a part back.
    for finished in 0..3 {
        let report = ps_scheduler::state::ClockReport {
            finished: Some(finished),
            ..Default::default()
        };
        s.advance(
            "leases",
            a.worker_id,
            "",
            report,
            Some(Duration::from_millis(10)),
        )
        .await
        .unwrap();
    }
    let (c, _) = s.join("leases", "c", 0, "").unwrap();
    assert_eq!((a.clock, c.clock), (0, 3));
    assert_eq!(c.assignment.data_shards.len(), 1);
    assert_eq!(live(&s)[0].2.len(), 1, "a gave one of its two parts to c");
    // `b` may come back under its old id.
    let (b2, _) = s.join("leases", "b", b.worker_id, "").unwrap();
    assert_eq!(b2.worker_id, b.worker_id);
    assert_eq!(live(&s).iter().filter(|w| w.1).count(), 3);
}

#[tokio::test(start_paused = true)]
async fn bad_calls_change_nothing() {
    let s = Scheduler::open(SchedulerConfig::default(), CancellationToken::new()).unwrap();
    assert!(matches!(
        s.join("nope", "a", 0, ""),
        Err(SchedError::NoSuchJob { ref job }) if job == "nope"
    ));
    let spec = JobSpec::from_toml(JOB).unwrap();
    s.submit(spec.clone()).await.unwrap();
    s.submit(spec.clone())
        .await
        .expect("the same spec again is fine");
    let mut other = spec.clone();
    other.num_workers = 3;
    assert!(matches!(
        s.submit(other).await,
        Err(SchedError::JobExists { .. })
    ));
    let (a, _) = s.join("leases", "a", 0, "").unwrap();
    let report = ps_scheduler::state::ClockReport {
        finished: Some(7),
        ..Default::default()
    };
    let e = s
        .advance(
            "leases",
            a.worker_id,
            "",
            report,
            Some(Duration::from_millis(10)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            SchedError::ClockOutOfOrder {
                clock: 0,
                reported: 7,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        s.with_job("leases", |j, _| j.clocks.clock(a.worker_id))
            .unwrap(),
        Some(0),
        "the refused report changed nothing"
    );
    let report = ps_scheduler::state::ClockReport::default();
    assert!(matches!(
        s.advance("leases", 999, "", report, None).await,
        Err(SchedError::NotMember { worker: 999, .. })
    ));
}

/// A worker that calls is not computing. A grant whose answer was lost (the call was cut and
/// retried) must not leave the worker marked running: a resume waits for no worker to be
/// running, and would wait forever.
#[tokio::test(start_paused = true)]
async fn a_worker_whose_grant_was_lost_is_not_left_running() {
    let s = Scheduler::open(SchedulerConfig::default(), CancellationToken::new()).unwrap();
    // The scheduler connects to a shard's address before publishing it: a listener stands in
    // for the shard (nothing here calls it).
    let shard = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", shard.local_addr().unwrap());
    s.register_shard(0, 1, 128, endpoint, "").await.unwrap();
    let mut spec = JobSpec::from_toml(JOB).unwrap();
    spec.num_workers = 1;
    s.submit(spec).await.unwrap();
    let (a, _) = s.join("leases", "a", 0, "").unwrap();
    // The tables exist (there is no real shard here to create them on).
    s.with_job("leases", |j, c| {
        j.tables_ready = true;
        j.refresh(c);
    })
    .unwrap();
    let running = || {
        s.with_job("leases", |j, _| j.workers[&a.worker_id].running)
            .unwrap()
    };
    let wait = Some(Duration::from_millis(10));
    let report = ps_scheduler::state::ClockReport::default;
    let (g, _) = s
        .advance("leases", a.worker_id, "", report(), wait)
        .await
        .unwrap();
    assert!(g.ready && g.clock == 0, "{g:?}");
    assert!(running());
    // The answer is lost; the worker asks again while the job is held (a resume holds it).
    s.with_job("leases", |j, c| {
        j.resuming = true;
        j.refresh(c);
    })
    .unwrap();
    let (g, _) = s
        .advance("leases", a.worker_id, "", report(), wait)
        .await
        .unwrap();
    assert!(!g.ready, "{g:?}");
    assert!(!running(), "a worker asking for a grant is not computing");
}

/// A running job whose workers all lost their leases says so in its status (it sat `running`
/// with no live worker and no word before), and runs again when a worker rejoins under the
/// id it was issued; an id the job never issued is refused, whatever its value.
#[tokio::test(start_paused = true)]
async fn a_job_with_no_live_worker_says_so_and_ids_are_the_schedulers_to_issue() {
    use ps_core::status::JobState;
    let s = Scheduler::open(SchedulerConfig::default(), CancellationToken::new()).unwrap();
    let shard = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", shard.local_addr().unwrap());
    s.register_shard(0, 1, 128, endpoint.clone(), "")
        .await
        .unwrap();
    s.submit(JobSpec::from_toml(JOB).unwrap()).await.unwrap();
    let (a, _) = s.join("leases", "a", 0, "").unwrap();
    let (b, _) = s.join("leases", "b", 0, "").unwrap();
    assert_ne!(a.worker_id, b.worker_id);
    s.with_job("leases", |j, c| {
        j.tables_ready = true;
        j.refresh(c);
    })
    .unwrap();
    let state = |s: &Scheduler| {
        s.with_job("leases", |j, _| (j.state, j.message.clone()))
            .unwrap()
    };
    assert_eq!(state(&s).0, JobState::Running);
    // Neither heartbeats (the shard does, to keep the map whole).
    for _ in 0..8 {
        advance(Duration::from_millis(250)).await;
        s.shard_heartbeat(0, &endpoint, "").unwrap();
        tokio::task::yield_now().await;
    }
    let (st, message) = state(&s);
    assert_eq!(st, JobState::Paused, "{message}");
    assert!(message.contains("no live worker"), "{message}");
    // Ids the job never issued are refused: one far ahead, the largest, 0's neighbour.
    for id in [a.worker_id.max(b.worker_id) + 1, u64::MAX, 12345] {
        let e = s.join("leases", "x", id, "").unwrap_err();
        assert!(
            matches!(e, SchedError::UnknownWorker { worker, .. } if worker == id),
            "{e}"
        );
    }
    // Taken up again under their ids, the job runs.
    s.join("leases", "a", a.worker_id, "").unwrap();
    s.join("leases", "b", b.worker_id, "").unwrap();
    assert_eq!(state(&s).0, JobState::Running, "{}", state(&s).1);
    // A new member gets an id never issued before.
    let (c, _) = s.join("leases", "c", 0, "").unwrap();
    assert!(c.worker_id > a.worker_id.max(b.worker_id));
}

/// With authenticated callers, a worker id is its joiner's and a shard slot its registrant's
/// while the lease holds: another caller cannot join under the id, heartbeat it, report its
/// clocks or make it leave, nor register over the slot or heartbeat it. The holder can.
#[tokio::test(start_paused = true)]
async fn worker_ids_and_shard_slots_belong_to_the_caller_that_took_them() {
    let s = Scheduler::open(SchedulerConfig::default(), CancellationToken::new()).unwrap();
    let shard = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", shard.local_addr().unwrap());
    s.register_shard(0, 1, 128, endpoint.clone(), "shard-a")
        .await
        .unwrap();
    let not_yours = |e: SchedError| assert!(matches!(e, SchedError::NotYours { .. }), "{e}");
    not_yours(
        s.register_shard(0, 1, 128, endpoint.clone(), "shard-b")
            .await
            .unwrap_err(),
    );
    not_yours(s.shard_heartbeat(0, &endpoint, "shard-b").unwrap_err());
    s.shard_heartbeat(0, &endpoint, "shard-a").unwrap();

    s.submit(JobSpec::from_toml(JOB).unwrap()).await.unwrap();
    let (a, _) = s.join("leases", "a", 0, "alice").unwrap();
    not_yours(s.join("leases", "a", a.worker_id, "mallory").unwrap_err());
    not_yours(
        s.worker_heartbeat("leases", a.worker_id, "mallory")
            .unwrap_err(),
    );
    let report = ps_scheduler::state::ClockReport {
        finished: Some(0),
        ..Default::default()
    };
    not_yours(
        s.advance("leases", a.worker_id, "mallory", report, None)
            .await
            .unwrap_err(),
    );
    not_yours(s.leave("leases", a.worker_id, "mallory").unwrap_err());
    // Nothing changed for alice: still live, and hers to use.
    let members: Vec<(u64, bool)> = live(&s).into_iter().map(|(id, l, _)| (id, l)).collect();
    assert_eq!(members, vec![(a.worker_id, true)]);
    s.worker_heartbeat("leases", a.worker_id, "alice").unwrap();
    s.join("leases", "a", a.worker_id, "alice").unwrap();
    s.leave("leases", a.worker_id, "alice").unwrap();

    // Once the shard's lease has run out, the slot is free for another identity.
    advance(Duration::from_secs(6)).await;
    s.register_shard(0, 1, 128, endpoint, "shard-b")
        .await
        .unwrap();
}

/// A worker that has finished the job's clocks is stopped only once every worker has: what it
/// reads after its stop (a final evaluation, an export) then holds every worker's last push.
/// A worker that goes away (its lease expires) ends the wait as finishing would.
#[tokio::test(start_paused = true)]
async fn a_finished_worker_is_stopped_when_the_others_have_finished_too() {
    let s = Scheduler::open(SchedulerConfig::default(), CancellationToken::new()).unwrap();
    let mut spec = JobSpec::from_toml(JOB).unwrap();
    spec.num_workers = 3;
    spec.max_clocks = 2;
    s.submit(spec).await.unwrap();
    let (a, _) = s.join("leases", "a", 0, "").unwrap();
    let (b, _) = s.join("leases", "b", 0, "").unwrap();
    let (c, _) = s.join("leases", "c", 0, "").unwrap();
    let wait = Some(Duration::from_millis(10));
    let report = |finished| ps_scheduler::state::ClockReport {
        finished,
        ..Default::default()
    };
    let state = || s.with_job("leases", |j, _| j.state).unwrap();
    for finished in 0..2 {
        let (g, _) = s
            .advance("leases", a.worker_id, "", report(Some(finished)), wait)
            .await
            .unwrap();
        if finished == 1 {
            assert!(!g.stop && !g.ready, "a waits for b and c: {g:?}");
        }
    }
    // Asking again (the long poll ran out) still waits.
    let (g, _) = s
        .advance("leases", a.worker_id, "", report(None), wait)
        .await
        .unwrap();
    assert!(!g.stop && !g.ready, "{g:?}");
    assert!(!state().is_terminal());

    // b finishes both clocks; c's lease runs out while a and b heartbeat.
    s.advance("leases", b.worker_id, "", report(Some(0)), wait)
        .await
        .unwrap();
    let (g, _) = s
        .advance("leases", b.worker_id, "", report(Some(1)), wait)
        .await
        .unwrap();
    assert!(!g.stop, "c has not finished: {g:?}");
    let waiting = {
        let s = s.clone();
        tokio::spawn(async move {
            s.advance(
                "leases",
                a.worker_id,
                "",
                report(None),
                Some(Duration::from_secs(30)),
            )
            .await
        })
    };
    for _ in 0..6 {
        advance(Duration::from_millis(250)).await;
        s.worker_heartbeat("leases", a.worker_id, "").unwrap();
        s.worker_heartbeat("leases", b.worker_id, "").unwrap();
        tokio::task::yield_now().await;
    }
    assert!(
        !live(&s).iter().any(|w| w.0 == c.worker_id && w.1),
        "c's lease expired"
    );
    assert!(state().is_terminal(), "{:?}", state());
    let (g, _) = waiting.await.unwrap().unwrap();
    assert!(
        g.stop,
        "a, waiting, is stopped once the job has ended: {g:?}"
    );
    let (g, _) = s
        .advance("leases", b.worker_id, "", report(None), wait)
        .await
        .unwrap();
    assert!(g.stop, "{g:?}");
}
