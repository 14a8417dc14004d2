//! Keys, grants and authentication through the public API.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_store::{
    Action, AuditQuery, Error, Grant, KeyFilter, KeyId, KeySpec, PrincipalId, Scope,
};

use crate::harness::{Fixture, TestDb, namespace, noon, queue};

fn assert_unauthorized(result: Result<tessera_store::Caller, Error>) {
    let error = result.unwrap_err();
    assert!(matches!(error, Error::Unauthorized), "{error:?}");
    assert_eq!(error.status(), 401);
    assert_eq!(error.code(), "unauthorized");
}

fn missing_malformed_and_unknown_keys_are_401_and_write_nothing(db: &TestDb) {
    let f = Fixture::new(db);
    let key = f.worker(Grant::AllNamespaces);
    let genuine = key.secret.expose().to_owned();
    let unknown_id = format!("tsk_{}_{}", "f".repeat(16), &genuine[21..]);
    let wrong_secret = format!("{}{}", &genuine[..21], "0".repeat(64));
    let before = f.store.meter();
    let snapshot = db.table_snapshot();
    for presented in [
        None,
        Some(""),
        Some("Bearer x"),
        Some("tsk_nonsense"),
        Some(unknown_id.as_str()),
        Some(wrong_secret.as_str()),
    ] {
        assert_unauthorized(f.store.authenticate(presented));
    }
    if db.meters_rows() {
        let cost = f.store.meter().since(&before);
        assert_eq!(cost.rows_written, 0);
        assert_eq!(cost.write_transactions, 0);
        // Only the two well-formed keys were looked up, and only the one
        // with a real key id found a row.
        assert_eq!(cost.rows_read, 1);
    }
    assert_eq!(db.table_snapshot(), snapshot);
    // Counted in memory instead.
    assert_eq!(f.store.pending_counters(), 6);
}

fn expired_and_revoked_keys_are_401(db: &TestDb) {
    let f = Fixture::new(db);
    let expiring = f
        .store
        .create_key(
            &f.admin,
            &KeySpec::keyed("acme")
                .with_grant(Grant::AllNamespaces)
                .with_expiry(noon() + chrono::TimeDelta::hours(1)),
        )
        .unwrap();
    assert!(f.store.authenticate(Some(expiring.secret.expose())).is_ok());
    f.clock.advance(Duration::from_secs(3600));
    assert_unauthorized(f.store.authenticate(Some(expiring.secret.expose())));

    let revoked = f.worker(Grant::AllNamespaces);
    let worker = f.login(&revoked);
    let info = f.store.revoke_key(&f.admin, worker.key_id()).unwrap();
    assert!(info.revoked_at.is_some());
    assert_unauthorized(f.store.authenticate(Some(revoked.secret.expose())));
    // A caller resolved before the revocation fails its re-check.
    assert_unauthorized(f.store.recheck(&worker));
}

fn grants_decide_403_before_any_namespace_work(db: &TestDb) {
    let f = Fixture::new(db);
    let one = f.login(&f.worker(Grant::Namespace(namespace("renders"))));
    let every = f.login(&f.worker(Grant::AllNamespaces));
    let renders = namespace("renders");
    let other = namespace("billing");

    assert!(
        f.store
            .authorize(&one, &renders, Scope::Claim, Action::Claim)
            .is_ok()
    );
    let denied = f
        .store
        .authorize(&one, &other, Scope::Claim, Action::Claim)
        .unwrap_err();
    assert_eq!((denied.status(), denied.code()), (403, "forbidden"));
    let no_scope = f
        .store
        .authorize(&one, &renders, Scope::Enqueue, Action::Enqueue)
        .unwrap_err();
    assert_eq!(no_scope.status(), 403);

    assert!(
        f.store
            .authorize(&every, &other, Scope::Read, Action::ReadTask)
            .is_ok()
    );
    assert!(every.require_admin().is_err());
    assert!(
        f.store
            .authorize(&f.admin, &other, Scope::Enqueue, Action::Enqueue)
            .is_ok()
    );
    assert!(f.admin.is_admin());
}

fn only_admins_create_keys_and_the_admin_grant_needs_an_admin_principal(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.worker(Grant::AllNamespaces));
    let error = f
        .store
        .create_key(&worker, &KeySpec::keyed("acme"))
        .unwrap_err();
    assert_eq!(error.status(), 403);
    let error = f
        .store
        .create_key(&f.admin, &KeySpec::keyed("acme").with_grant(Grant::Admin))
        .unwrap_err();
    assert_eq!(error.code(), "invalid_input");
    let second_admin = f
        .store
        .create_key(&f.admin, &KeySpec::admin("ops"))
        .unwrap();
    assert!(f.login(&second_admin).is_admin());
}

fn a_key_an_existing_principal_cannot_hold_is_a_conflict_and_writes_nothing(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.worker(Grant::AllNamespaces));
    let session = f.store.mint_session("192.0.2.9".parse().unwrap()).unwrap();
    let anonymous = f.login(&session.key);
    let before = f.store.list_keys(&f.admin, &KeyFilter::default()).unwrap();
    // What the stored principal is decides these, not the request's shape.
    for spec in [
        KeySpec::for_principal(worker.principal()).with_grant(Grant::Admin),
        KeySpec::for_principal(anonymous.principal()),
    ] {
        let error = f.store.create_key(&f.admin, &spec).unwrap_err();
        assert_eq!((error.status(), error.code()), (409, "conflict"), "{error}");
    }
    let after = f.store.list_keys(&f.admin, &KeyFilter::default()).unwrap();
    assert_eq!(after, before);
}

fn another_key_for_the_same_principal_shares_its_identity(db: &TestDb) {
    let f = Fixture::new(db);
    let first = f.login(&f.worker(Grant::AllNamespaces));
    let second = f
        .store
        .create_key(
            &f.admin,
            &KeySpec::for_principal(first.principal()).with_scopes([Scope::Read]),
        )
        .unwrap();
    let second = f.login(&second);
    assert_eq!(second.principal(), first.principal());
    assert_ne!(second.key_id(), first.key_id());
    assert_eq!(second.scopes(), &[Scope::Read]);
}

fn listing_never_shows_a_secret_and_respects_ownership(db: &TestDb) {
    let f = Fixture::new(db);
    let key = f.worker(Grant::AllNamespaces);
    let other = f.worker(Grant::AllNamespaces);
    let worker = f.login(&key);

    let own = f.store.list_keys(&worker, &KeyFilter::default()).unwrap();
    assert_eq!(own.len(), 1);
    assert_eq!(&own[0].key_id, worker.key_id());
    let json = serde_json::to_string(&own).unwrap();
    assert!(!json.contains(&key.secret.expose()[21..]));

    let all = f.store.list_keys(&f.admin, &KeyFilter::default()).unwrap();
    assert_eq!(all.len(), 3);
    let paged = f
        .store
        .list_keys(
            &f.admin,
            &KeyFilter {
                after: Some(all[0].key_id.clone()),
                limit: 1,
                ..KeyFilter::default()
            },
        )
        .unwrap();
    assert_eq!(paged, vec![all[1].clone()]);

    let theirs = KeyFilter {
        principal: Some(other.info.principal),
        ..KeyFilter::default()
    };
    assert_eq!(
        f.store.list_keys(&worker, &theirs).unwrap_err().status(),
        403
    );
    assert_eq!(f.store.list_keys(&f.admin, &theirs).unwrap().len(), 1);
    // Another principal's key is not found, rather than forbidden.
    let error = f.store.revoke_key(&worker, &other.info.key_id).unwrap_err();
    assert_eq!(error.status(), 404);
}

fn key_management_is_audited_and_no_ops_are_not(db: &TestDb) {
    let f = Fixture::new(db);
    let key = f.worker(Grant::AllNamespaces);
    let worker = f.login(&key);
    f.store.revoke_key(&worker, worker.key_id()).unwrap();
    let before = f.store.meter();
    // Revoking again changes nothing and writes nothing.
    f.store.revoke_key(&f.admin, worker.key_id()).unwrap();
    if db.meters_rows() {
        assert_eq!(f.store.meter().since(&before).rows_written, 0);
    }

    let expiry = noon() + chrono::TimeDelta::days(1);
    let other = f.login(&f.worker(Grant::AllNamespaces));
    let info = f
        .store
        .expire_key(&f.admin, other.key_id(), expiry)
        .unwrap();
    assert_eq!(info.expires_at, Some(expiry));

    let page = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    let actions: Vec<Action> = page.events.iter().map(|event| event.action).collect();
    for expected in [Action::CreateKey, Action::RevokeKey, Action::ExpireKey] {
        assert!(actions.contains(&expected), "{expected:?} in {actions:?}");
    }
    let revocations = actions.iter().filter(|a| **a == Action::RevokeKey).count();
    assert_eq!(revocations, 1);
    let revoke = page
        .events
        .iter()
        .find(|event| event.action == Action::RevokeKey)
        .unwrap();
    assert_eq!(
        revoke.resource.as_ref().unwrap().as_str(),
        format!("key:{}", worker.key_id())
    );
    assert_eq!(revoke.principal.as_str(), worker.principal().to_string());
}

fn expiring_a_key_now_stops_it(db: &TestDb) {
    let f = Fixture::new(db);
    let key = f.worker(Grant::AllNamespaces);
    let worker = f.login(&key);
    f.store
        .expire_key(&worker, worker.key_id(), noon())
        .unwrap();
    assert_unauthorized(f.store.authenticate(Some(key.secret.expose())));
}

/// The worker's `last_used_at` as an admin lists it.
fn last_used_at(f: &Fixture<'_>, principal: PrincipalId) -> Option<DateTime<Utc>> {
    let filter = KeyFilter {
        principal: Some(principal),
        ..KeyFilter::default()
    };
    f.store.list_keys(&f.admin, &filter).unwrap()[0].last_used_at
}

fn last_used_at_rides_with_audited_actions_at_most_once_per_interval(db: &TestDb) {
    let f = Fixture::new(db);
    let metered = db.meters_rows();
    let key = f.full_worker(Grant::AllNamespaces);
    let (ns, q) = (namespace("renders"), queue("jobs"));

    // Resolving a key writes nothing, first sight included.
    let (worker, cost) = f
        .store
        .measure(|s| s.authenticate(Some(key.secret.expose())));
    let worker = worker.unwrap();
    if metered {
        assert_eq!(cost.rows_written, 0);
    }
    // The first audited action carries it: one row (no index holds
    // last_used_at) beside the action's own.
    let (_, cost) = f
        .store
        .measure(|s| s.list_keys(&worker, &KeyFilter::default()).unwrap());
    if metered {
        assert_eq!(cost.rows_written, 2 + 1);
        assert_eq!(cost.write_transactions, 1, "in the action's transaction");
    }
    assert_eq!(last_used_at(&f, worker.principal()), Some(noon()));
    // Within the interval audited actions carry nothing, however many.
    f.clock.advance(Duration::from_secs(10));
    let task = f.enqueue(&worker, &ns, &q, 1).remove(0);
    let claimed = f.store.claim(&worker, &ns, &q).unwrap();
    let token = claimed.claimed().unwrap().lease.token();
    let upload = tessera_store::IdempotencyKey::parse("upload").unwrap();
    let output = tessera_store::Output::bytes("done");
    let (_, cost) = f
        .store
        .measure(|s| s.submit(&worker, &task, token, &upload, &output).unwrap());
    if metered {
        // The attempt's `attempts_changed` entry moves with its state,
        // and its receipt is written in its row.
        assert_eq!(cost.rows_written, 6, "the submission's rows alone");
    }

    // Due again: requests that write nothing still pay nothing for it.
    f.clock.advance(Duration::from_secs(60));
    let (_, cost) = f.store.measure(|s| {
        let caller = s.authenticate(Some(key.secret.expose())).unwrap();
        // An empty claim, a replayed submission, a conflict and a denial.
        assert!(s.claim(&caller, &ns, &q).unwrap().claimed().is_none());
        let replayed = s.submit(&caller, &task, token, &upload, &output).unwrap();
        assert!(matches!(replayed, tessera_store::Submitted::Replayed(_)));
        assert_eq!(
            s.heartbeat(&caller, &task, token).unwrap_err().status(),
            409
        );
        assert_eq!(
            s.create_key(&caller, &KeySpec::keyed("x"))
                .unwrap_err()
                .status(),
            403
        );
    });
    if metered {
        assert_eq!((cost.rows_written, cost.write_transactions), (0, 0));
    }
    assert_eq!(last_used_at(&f, worker.principal()), Some(noon()));
    // The next audited action carries it, with its own time.
    let (_, cost) = f.store.measure(|s| s.read_task(&worker, &task).unwrap());
    if metered {
        assert_eq!(cost.rows_written, 2 + 1);
    }
    assert_eq!(
        last_used_at(&f, worker.principal()),
        Some(noon() + chrono::TimeDelta::seconds(70))
    );
}

fn a_changed_account_is_written_at_once(db: &TestDb) {
    let f = Fixture::new(db);
    let key = f.worker(Grant::AllNamespaces);
    let worker = f.login(&key);
    f.store.list_keys(&worker, &KeyFilter::default()).unwrap();
    f.clock.advance(Duration::from_secs(5));
    // Renamed behind the store's back.
    db.rename_account(worker.principal(), "globex");
    // Inside the interval, and with no audited action: written at once.
    let (caller, cost) = f
        .store
        .measure(|s| s.authenticate(Some(key.secret.expose())));
    assert_eq!(caller.unwrap().account(), "globex");
    if db.meters_rows() {
        assert_eq!((cost.rows_written, cost.write_transactions), (1, 1));
    }
    assert_eq!(
        last_used_at(&f, worker.principal()),
        Some(noon() + chrono::TimeDelta::seconds(5))
    );
    // That write starts the interval again: the next audited action
    // carries nothing.
    let (_, cost) = f
        .store
        .measure(|s| s.list_keys(&worker, &KeyFilter::default()).unwrap());
    if db.meters_rows() {
        // The audit row and its principal index entry.
        assert_eq!(cost.rows_written, 2);
    }
}

fn a_refused_last_used_write_does_not_fail_authentication(db: &TestDb) {
    let f = Fixture::new(db);
    let key = f.worker(Grant::AllNamespaces);
    let worker = f.login(&key);
    db.rename_account(worker.principal(), "globex");
    f.store.refuse_writes(true);
    let before = f.store.meter();
    let caller = f.store.authenticate(Some(key.secret.expose())).unwrap();
    assert_eq!(caller.principal(), key.info.principal);
    let cost = f.store.meter().since(&before);
    if db.meters_rows() {
        assert_eq!(cost.rows_written, 0);
        assert_eq!(cost.refused_writes, 1);
    }
    // The refusal is remembered: the next request does not try again.
    let (_, cost) = f
        .store
        .measure(|s| s.authenticate(Some(key.secret.expose())));
    if db.meters_rows() {
        assert_eq!(cost.refused_writes, 0);
    }
}

/// No database: runs once, not per backend.
#[test]
fn key_ids_parse_strictly() {
    assert!(KeyId::parse("0123456789abcdef").is_ok());
    assert!(KeyId::parse("0123456789ABCDEF").is_err());
    assert!(KeyId::parse("0123").is_err());
}

conformance! {
    missing_malformed_and_unknown_keys_are_401_and_write_nothing,
    expired_and_revoked_keys_are_401,
    grants_decide_403_before_any_namespace_work,
    only_admins_create_keys_and_the_admin_grant_needs_an_admin_principal,
    a_key_an_existing_principal_cannot_hold_is_a_conflict_and_writes_nothing,
    another_key_for_the_same_principal_shares_its_identity,
    listing_never_shows_a_secret_and_respects_ownership,
    key_management_is_audited_and_no_ops_are_not,
    expiring_a_key_now_stops_it,
    last_used_at_rides_with_audited_actions_at_most_once_per_interval,
    a_changed_account_is_written_at_once,
    a_refused_last_used_write_does_not_fail_authentication,
}
