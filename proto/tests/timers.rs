//! The session's timer table on its own clock: when pings fall due, when a silent peer is
//! declared dead, the rule for a check that comes late, and how the keepalive and the dial
//! deadlines share one next deadline.

use bridgehead_proto::session::{Event, Keepalive, Role, Session, SessionConfig};
use bridgehead_proto::Frame;

const KEEPALIVE: Keepalive = Keepalive {
    interval_ms: 1_000,
    timeout_ms: 3_000,
};

fn agent(now_ms: u64) -> Session {
    let mut session = Session::new(SessionConfig::new(Role::Agent));
    session.start_keepalive(KEEPALIVE, now_ms);
    session
}

/// Runs the session's timer as a driver would: wakes at each deadline up to `until`, and
/// returns the times a ping went out.
fn run_until(session: &mut Session, until: u64) -> Vec<u64> {
    let mut pings = Vec::new();
    // A table that never moves past a deadline would loop here forever: fail instead.
    let mut turns = 0..10_000;
    while let Some(at) = session.poll_timeout().filter(|at| *at <= until) {
        assert!(turns.next().is_some(), "the timer table is stuck at {at}");
        session.handle_timeout(at);
        if session.poll_ping() {
            pings.push(at);
        }
        if session.peer_silent().is_some() {
            break;
        }
    }
    pings
}

#[test]
fn without_a_keepalive_or_a_dial_nothing_is_ever_due() {
    let session = Session::new(SessionConfig::new(Role::Agent));
    assert_eq!(session.poll_timeout(), None);
}

#[test]
fn pings_fall_due_every_interval_and_once_each() {
    let mut session = agent(500);
    assert_eq!(session.poll_timeout(), Some(1_500));
    assert!(
        !session.poll_ping(),
        "nothing due before the first interval"
    );
    // The peer answers, so it is never silent here.
    let mut pings = Vec::new();
    for heard in [1_600, 2_600, 3_600] {
        pings.extend(run_until(&mut session, heard));
        session.heard(heard);
    }
    assert_eq!(pings, [1_500, 2_500, 3_500]);
    assert!(!session.poll_ping(), "a ping is taken once");
    assert_eq!(session.peer_silent(), None);
}

#[test]
fn a_ping_due_late_is_one_ping_and_the_next_is_an_interval_later() {
    let mut session = agent(0);
    session.heard(9_000);
    session.handle_timeout(10_000);
    assert!(session.poll_ping());
    assert!(
        !session.poll_ping(),
        "no burst to catch up the missed pings"
    );
    assert_eq!(session.poll_timeout(), Some(11_000));
}

#[test]
fn a_silent_peer_is_declared_dead_at_the_timeout_and_not_before() {
    let mut session = agent(0);
    session.handle_timeout(2_999);
    assert_eq!(session.peer_silent(), None);
    run_until(&mut session, 10_000);
    assert_eq!(session.peer_silent(), Some(3_000));
}

#[test]
fn hearing_the_peer_moves_the_silence_without_moving_the_timer_each_time() {
    let mut session = agent(0);
    session.heard(2_000);
    session.heard(2_500);
    // The silence check stays where it was set; the next deadline is the next ping.
    assert_eq!(session.poll_timeout(), Some(1_000));
    run_until(&mut session, 3_000);
    assert_eq!(
        session.peer_silent(),
        None,
        "heard at 2.5 s, alive until 5.5 s"
    );
    assert_eq!(session.poll_timeout(), Some(4_000));
    run_until(&mut session, 5_499);
    assert_eq!(session.peer_silent(), None);
    run_until(&mut session, 5_500);
    assert_eq!(session.peer_silent(), Some(3_000));
    assert_eq!(
        session.poll_timeout(),
        None,
        "a dead session's keepalive is done"
    );
}

/// A check more than an interval late means this end did not run (a stopped process, a paused
/// VM): the peer gets one more interval from then, and only stays dead if still silent.
#[test]
fn a_check_that_comes_late_gives_the_peer_one_more_interval() {
    let mut session = agent(0);
    // Due at 3 s, seen at 13 s.
    session.handle_timeout(13_000);
    assert_eq!(
        session.peer_silent(),
        None,
        "dropped for this end's own pause"
    );
    assert!(session.poll_ping());
    assert_eq!(session.poll_timeout(), Some(14_000));
    // Heard within the interval: alive for a whole timeout from then.
    session.heard(13_900);
    run_until(&mut session, 16_899);
    assert_eq!(session.peer_silent(), None);
    run_until(&mut session, 16_900);
    assert_eq!(session.peer_silent(), Some(3_000));
}

#[test]
fn a_late_check_still_ends_a_peer_that_stays_silent_through_the_extra_interval() {
    let mut session = agent(0);
    session.handle_timeout(13_000);
    assert_eq!(session.peer_silent(), None);
    session.handle_timeout(14_000);
    assert_eq!(session.peer_silent(), Some(3_000));
}

/// A check late by exactly an interval is on time: the rule is for more than an interval.
#[test]
fn a_check_late_by_no_more_than_an_interval_is_not_excused() {
    let mut session = agent(0);
    session.handle_timeout(4_000);
    assert_eq!(session.peer_silent(), Some(3_000));
}

#[test]
fn dial_deadlines_and_the_keepalive_share_one_next_deadline() {
    let mut server = Session::new(SessionConfig::new(Role::Server));
    server.start_keepalive(KEEPALIVE, 0);
    let stream = server.open("target", 1, 500, 0).unwrap();
    assert_eq!(
        server.poll_timeout(),
        Some(500),
        "the dial's deadline first"
    );
    server.handle_timeout(500);
    let failed: Vec<Event> = std::iter::from_fn(|| server.poll_event()).collect();
    assert!(
        matches!(&failed[..], [Event::DialFailed { stream: s, expired: true, .. }] if *s == stream),
        "{failed:?}"
    );
    assert!(!server.poll_ping());
    assert_eq!(server.poll_timeout(), Some(1_000), "then the keepalive's");
    // The agent's answer to a later dial takes its deadline out of the table.
    let second = server.open("target", 1, 5_000, 600).unwrap();
    assert_eq!(server.next_deadline(), Some(5_600));
    while server.poll_transmit().is_some() {}
    server
        .handle_frame(Frame::DialOk {
            stream: second,
            window: 1024,
        })
        .unwrap();
    assert_eq!(server.next_deadline(), None);
    assert_eq!(server.poll_timeout(), Some(1_000));
}
