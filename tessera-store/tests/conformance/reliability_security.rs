//! Who may do what: every operation against every kind of presented key,
//! and secrets that never surface in an error, a `Debug` string, an audit
//! row, a counter or the database file.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use chrono::TimeDelta;
use tessera_store::{
    AttemptNumber, AuditQuery, Caller, ClaimOutcome, ClaimStart, Error, FencingToken, Grant,
    IdempotencyKey, IssuedKey, KeyFilter, KeySpec, Output, Retry, Scope, Secret, StoreConfig,
    TaskRef,
};

use crate::harness::{Fixture, TestDb, namespace, noon, queue};

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// Every operation a caller's key decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Enqueue,
    Claim,
    BeginClaim,
    WaitForWork,
    Heartbeat,
    Submit,
    Fail,
    ReadTask,
    ReadReceipt,
    Alternatives,
    Health,
    CreateKey,
    ListOwnKeys,
    ListOthersKeys,
    RevokeOthersKey,
    ExpireOthersKey,
    OwnAudit,
    OthersAudit,
}

const OPS: [Op; 18] = [
    Op::Enqueue,
    Op::Claim,
    Op::BeginClaim,
    Op::WaitForWork,
    Op::Heartbeat,
    Op::Submit,
    Op::Fail,
    Op::ReadTask,
    Op::ReadReceipt,
    Op::Alternatives,
    Op::Health,
    Op::CreateKey,
    Op::ListOwnKeys,
    Op::ListOthersKeys,
    Op::RevokeOthersKey,
    Op::ExpireOthersKey,
    Op::OwnAudit,
    Op::OthersAudit,
];

impl Op {
    /// The action a denial of this operation is counted under.
    fn action(self) -> &'static str {
        match self {
            Op::Enqueue => "enqueue",
            Op::Claim | Op::BeginClaim => "claim",
            Op::WaitForWork => "wait_for_work",
            Op::Heartbeat => "heartbeat",
            Op::Submit => "submit",
            Op::Fail => "fail",
            Op::ReadTask => "read_task",
            Op::ReadReceipt => "read_receipt",
            Op::Alternatives => "list_attempts",
            Op::Health => "read_health",
            Op::CreateKey => "create_key",
            Op::ListOwnKeys | Op::ListOthersKeys => "list_keys",
            Op::RevokeOthersKey => "revoke_key",
            Op::ExpireOthersKey => "expire_key",
            Op::OwnAudit | Op::OthersAudit => "read_audit",
        }
    }

    /// Whether it works on one namespace's data.
    fn in_namespace(self) -> bool {
        self <= Op::Health
    }

    /// Whether it needs more than the `read` scope.
    fn writes_tasks(self) -> bool {
        self <= Op::Fail
    }
}

/// The kinds of presented key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Identity {
    NoKey,
    Unknown,
    Expired,
    Revoked,
    OtherNamespace,
    /// The right namespace, only the `read` scope.
    ReadOnly,
    AllNamespaces,
    Admin,
}

const IDENTITIES: [Identity; 8] = [
    Identity::NoKey,
    Identity::Unknown,
    Identity::Expired,
    Identity::Revoked,
    Identity::OtherNamespace,
    Identity::ReadOnly,
    Identity::AllNamespaces,
    Identity::Admin,
];

/// `None` if the cell succeeds, else the status it is denied with.
fn expected(identity: Identity, op: Op) -> Option<u16> {
    let own = matches!(op, Op::ListOwnKeys | Op::OwnAudit);
    match identity {
        Identity::NoKey | Identity::Unknown | Identity::Expired | Identity::Revoked => Some(401),
        Identity::Admin => None,
        _ if own => None,
        // Another principal's key is not found rather than forbidden.
        _ if matches!(op, Op::RevokeOthersKey | Op::ExpireOthersKey) => Some(404),
        _ if !op.in_namespace() => Some(403),
        Identity::OtherNamespace => Some(403),
        Identity::ReadOnly if op.writes_tasks() => Some(403),
        Identity::ReadOnly | Identity::AllNamespaces => None,
    }
}

/// What the operations act on.
struct World<'db> {
    setup: Fixture<'db>,
    keys: BTreeMap<&'static str, IssuedKey>,
    /// Another principal, whose keys and audit are not the callers'.
    victim: IssuedKey,
    /// A lease the admin holds, which denied callers try to use.
    held: (TaskRef, FencingToken),
    /// A finished task with a receipt, which every caller tries to read.
    done: TaskRef,
}

const PROD: &str = "prod";

fn world(db: &TestDb) -> World<'_> {
    let setup = Fixture::new(db);
    let prod = namespace(PROD);
    let admin = setup.admin.clone();
    let key = |scopes: &[Scope], grant: Grant| setup.key(scopes, grant);
    let mut keys = BTreeMap::new();
    keys.insert(
        "other",
        key(Scope::ALL, Grant::Namespace(namespace("elsewhere"))),
    );
    keys.insert(
        "read_only",
        key(&[Scope::Read], Grant::Namespace(prod.clone())),
    );
    keys.insert("all", key(Scope::ALL, Grant::AllNamespaces));
    let expired = key(Scope::ALL, Grant::AllNamespaces);
    setup
        .store
        .expire_key(&admin, &expired.info.key_id, noon())
        .unwrap();
    keys.insert("expired", expired);
    let revoked = key(Scope::ALL, Grant::AllNamespaces);
    setup
        .store
        .revoke_key(&admin, &revoked.info.key_id)
        .unwrap();
    keys.insert("revoked", revoked);
    let victim = key(&[Scope::Read], Grant::Namespace(prod.clone()));

    let enqueue = |q: &str, n| setup.enqueue_one(&admin, &prod, &queue(q), n);
    let done = enqueue("finished", 1);
    let ClaimOutcome::Granted(lease) = setup
        .store
        .claim(&admin, &prod, &queue("finished"))
        .unwrap()
    else {
        panic!("claimable");
    };
    let submitted = setup
        .store
        .submit(
            &admin,
            &done,
            lease.lease.token(),
            &IdempotencyKey::parse("k").unwrap(),
            &Output::bytes("done"),
        )
        .unwrap();
    assert!(matches!(submitted, tessera_store::Submitted::Accepted(_)));
    let held_task = enqueue("held", 2);
    let ClaimOutcome::Granted(held) = setup.store.claim(&admin, &prod, &queue("held")).unwrap()
    else {
        panic!("claimable");
    };
    // Two tasks for each caller that may claim, in a queue of its own.
    for (n, q) in [(10, "q-all"), (20, "q-admin")] {
        enqueue(q, n);
        enqueue(q, n + 1);
    }
    World {
        setup,
        keys,
        victim,
        held: (held_task, held.lease.token()),
        done,
    }
}

/// Leases a caller obtained in its own row of the matrix.
#[derive(Default)]
struct Own {
    leases: Vec<(TaskRef, FencingToken)>,
}

impl World<'_> {
    fn caller(&self, identity: Identity) -> Result<Caller, Error> {
        let store = &self.setup.store;
        let presented = match identity {
            Identity::NoKey => return store.authenticate(None),
            Identity::Unknown => format!("tsk_{}_{}", "0".repeat(16), "1".repeat(64)),
            Identity::Expired => self.keys["expired"].secret.expose().to_owned(),
            Identity::Revoked => self.keys["revoked"].secret.expose().to_owned(),
            Identity::OtherNamespace => self.keys["other"].secret.expose().to_owned(),
            Identity::ReadOnly => self.keys["read_only"].secret.expose().to_owned(),
            Identity::AllNamespaces => self.keys["all"].secret.expose().to_owned(),
            Identity::Admin => self.setup.admin_key.secret.expose().to_owned(),
        };
        store.authenticate(Some(&presented))
    }

    fn run(&self, op: Op, caller: &Caller, own: &mut Own, row: &str) -> Result<(), Error> {
        let store = &self.setup.store;
        let prod = namespace(PROD);
        let q = queue(&format!("q-{row}"));
        // A caller's own lease if it has one, else the one it has no right to.
        let lease = |n: usize| own.leases.get(n).cloned().unwrap_or(self.held.clone());
        let victim = &self.victim.info;
        match op {
            Op::Enqueue => store
                .enqueue(
                    caller,
                    &prod,
                    &q,
                    &tessera_store::Brief::Bytes(vec![1]),
                    &Default::default(),
                )
                .map(drop),
            Op::Claim => {
                if let ClaimOutcome::Granted(claimed) = store.claim(caller, &prod, &q)? {
                    own.leases.push((claimed.task, claimed.lease.token()));
                }
                Ok(())
            }
            Op::BeginClaim => {
                let ClaimStart::Admitted(permit) = store.begin_claim(caller, &prod, &q)? else {
                    panic!("capacity is free");
                };
                if let ClaimOutcome::Granted(claimed) = store.finish_claim(permit)? {
                    own.leases.push((claimed.task, claimed.lease.token()));
                }
                Ok(())
            }
            Op::WaitForWork => store
                .wait_for_work(caller, &prod, &q, Duration::ZERO)
                .map(drop),
            Op::Heartbeat => {
                let (task, token) = lease(0);
                store.heartbeat(caller, &task, token).map(drop)
            }
            Op::Submit => {
                let (task, token) = lease(0);
                let key = IdempotencyKey::parse("matrix").unwrap();
                store
                    .submit(caller, &task, token, &key, &Output::bytes("out"))
                    .map(drop)
            }
            Op::Fail => {
                let (task, token) = lease(1);
                store.fail(caller, &task, token, Retry::Never).map(drop)
            }
            Op::ReadTask => store.read_task(caller, &self.done).map(drop),
            Op::ReadReceipt => store
                .read_receipt(caller, &self.done, AttemptNumber::FIRST)
                .map(drop),
            Op::Alternatives => store.alternatives(caller, &self.done).map(drop),
            Op::Health => store.health(caller, &prod).map(drop),
            Op::CreateKey => store.create_key(caller, &KeySpec::keyed("acme")).map(drop),
            Op::ListOwnKeys => store.list_keys(caller, &KeyFilter::default()).map(drop),
            Op::ListOthersKeys => {
                let filter = KeyFilter {
                    principal: Some(victim.principal),
                    ..KeyFilter::default()
                };
                store.list_keys(caller, &filter).map(drop)
            }
            Op::RevokeOthersKey => store.revoke_key(caller, &victim.key_id).map(drop),
            Op::ExpireOthersKey => store
                .expire_key(caller, &victim.key_id, noon() + TimeDelta::days(1))
                .map(drop),
            Op::OwnAudit => store.audit(caller, &AuditQuery::default()).map(drop),
            Op::OthersAudit => {
                let query = AuditQuery {
                    principal: Some(victim.principal),
                    ..AuditQuery::default()
                };
                store.audit(caller, &query).map(drop)
            }
        }
    }
}

fn every_operation_against_every_kind_of_key(db: &TestDb) {
    let world = world(db);
    let store = &world.setup.store;
    // Denials expected in the counters: (principal, action, outcome).
    let mut denials: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let mut cells = 0;
    for identity in IDENTITIES {
        let row = match identity {
            Identity::AllNamespaces => "all",
            Identity::Admin => "admin",
            _ => "denied",
        };
        let mut own = Own::default();
        for op in OPS {
            cells += 1;
            let cell = format!("{identity:?} x {op:?}");
            let expect = expected(identity, op);
            // A key that resolves is resolved first (its coalesced
            // last_used_at is not the cell's); one that does not is the
            // cell's own refusal.
            let resolved = match identity {
                Identity::NoKey | Identity::Unknown | Identity::Expired | Identity::Revoked => None,
                _ => Some(world.caller(identity).unwrap()),
            };
            // Counters written now, so the snapshot below sees only this cell.
            store.flush_counters().unwrap();
            let before = db.table_snapshot();
            let audit_rows = db.count_rows("access_audit");
            let counted = store.pending_counters();
            let (result, cost) = world.setup.store.measure(|_| {
                let caller = match &resolved {
                    Some(caller) => caller.clone(),
                    None => world.caller(identity)?,
                };
                world.run(op, &caller, &mut own, row)
            });
            match (expect, result) {
                (None, Ok(())) if op == Op::Health => {
                    // An aggregate status read: no audit row, nothing
                    // written, not counted.
                    assert_eq!(store.pending_counters(), counted, "{cell}");
                    if db.meters_rows() {
                        assert_eq!(cost.rows_written, 0, "{cell}");
                    }
                    assert_eq!(db.table_snapshot(), before, "{cell}");
                }
                (None, Ok(())) => {
                    // A success leaves its audit row.
                    assert!(db.count_rows("access_audit") > audit_rows, "{cell}");
                }
                (Some(status), Err(error)) => {
                    assert_eq!(error.status(), status, "{cell}: {error:?}");
                    // Denied: counted once, no audit row, nothing written,
                    // and no namespace data read.
                    assert_eq!(store.pending_counters(), counted + 1, "{cell}");
                    if db.meters_rows() {
                        assert_eq!(
                            (cost.rows_written, cost.write_transactions),
                            (0, 0),
                            "{cell}"
                        );
                        if op.in_namespace() && status != 401 {
                            assert_eq!(cost.rows_read, 0, "{cell}");
                        }
                    }
                    assert_eq!(db.table_snapshot(), before, "{cell}");
                    let (principal, action) = match (identity, &resolved) {
                        (_, Some(caller)) => (caller.principal().to_string(), op.action()),
                        (Identity::Expired, None) => (
                            world.keys["expired"].info.principal.to_string(),
                            "authenticate",
                        ),
                        (Identity::Revoked, None) => (
                            world.keys["revoked"].info.principal.to_string(),
                            "authenticate",
                        ),
                        (_, None) => (String::new(), "authenticate"),
                    };
                    let outcome = match status {
                        401 => "unauthorized",
                        403 => "forbidden",
                        _ => "not_found",
                    };
                    let entry = (principal, action.to_owned(), outcome.to_owned());
                    *denials.entry(entry).or_default() += 1;
                }
                (expect, result) => panic!("{cell}: expected {expect:?}, got {result:?}"),
            }
        }
    }
    assert_eq!(cells, 8 * 18);

    // Every denial is in the counters, under its principal, action and
    // outcome, and nowhere else.
    let page = store
        .audit(
            &world.setup.admin,
            &AuditQuery {
                limit: 1000,
                ..AuditQuery::default()
            },
        )
        .unwrap();
    let mut counted: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    for counter in &page.counters {
        let outcome = counter.key.outcome().as_str();
        if !matches!(outcome, "unauthorized" | "forbidden" | "not_found") {
            continue;
        }
        let principal = counter
            .key
            .principal()
            .map_or_else(String::new, |p| p.as_str().to_owned());
        let action = counter.key.action().as_str().to_owned();
        *counted
            .entry((principal, action, outcome.to_owned()))
            .or_default() += counter.count;
    }
    assert_eq!(counted, denials);
}

fn a_public_namespace_is_the_only_health_read_without_a_key(db: &TestDb) {
    let setup = Fixture::at(db, noon(), |config| {
        config.with_public_namespace(namespace("board"))
    });
    let before = db.table_snapshot();
    let counted = setup.store.pending_counters();
    let (result, cost) = setup.store.measure(|s| s.public_health(&namespace(PROD)));
    assert_eq!(result.unwrap_err().status(), 401);
    if db.meters_rows() {
        assert_eq!((cost.rows_read, cost.rows_written), (0, 0));
    }
    assert_eq!(setup.store.pending_counters(), counted + 1);
    assert!(setup.store.public_health(&namespace("board")).is_ok());
    assert_eq!(db.table_snapshot(), before);
}

/// Everything a host might print, log or return, as text.
#[derive(Default)]
struct Surface {
    texts: Vec<String>,
}

impl Surface {
    fn debug(&mut self, value: &impl std::fmt::Debug) {
        self.texts.push(format!("{value:?}"));
        self.texts.push(format!("{value:#?}"));
    }

    fn json(&mut self, value: &impl serde::Serialize) {
        self.texts.push(serde_json::to_string(value).unwrap());
    }

    fn error(&mut self, error: &Error) {
        self.texts.push(error.to_string());
        self.debug(error);
        self.json(&error.body());
        self.json(&error.tool_error());
        let mut source = std::error::Error::source(error);
        while let Some(inner) = source {
            self.texts.push(inner.to_string());
            source = inner.source();
        }
    }

    fn result<T: std::fmt::Debug>(&mut self, result: Result<T, Error>) -> Option<T> {
        match result {
            Ok(value) => {
                self.debug(&value);
                Some(value)
            }
            Err(error) => {
                self.error(&error);
                None
            }
        }
    }
}

fn secrets_never_reach_an_error_a_debug_string_an_audit_row_or_the_file(db: &TestDb) {
    let address_secret = *b"a-host-secret-for-address-hashes";
    let setup = Fixture::at(db, noon(), |config: StoreConfig| {
        config.with_address_secret(Secret::new(address_secret).unwrap())
    });
    let store = &setup.store;
    let prod = namespace(PROD);
    let mut surface = Surface::default();
    let mut secrets: Vec<Vec<u8>> =
        vec![address_secret.to_vec(), hex(&address_secret).into_bytes()];
    let remember = |key: &IssuedKey, secrets: &mut Vec<Vec<u8>>| {
        let whole = key.secret.expose();
        secrets.push(whole.as_bytes().to_vec());
        // The part after `tsk_<key id>_`.
        secrets.push(whole.as_bytes()[21..].to_vec());
    };
    remember(&setup.admin_key, &mut secrets);

    let worker_key = setup.key(Scope::ALL, Grant::Namespace(prod.clone()));
    remember(&worker_key, &mut secrets);
    surface.debug(&worker_key);
    surface.json(&worker_key.info);
    let address: IpAddr = "2001:db8::7".parse().unwrap();
    let session = store.mint_session(address).unwrap();
    remember(&session.key, &mut secrets);
    surface.debug(&session);
    surface.json(&session);
    let worker = setup.login(&worker_key);
    surface.debug(&worker);
    surface.json(&worker);
    surface.debug(store);
    surface.debug(
        &setup
            .config()
            .with_address_secret(Secret::new(address_secret).unwrap()),
    );
    surface.debug(&Secret::new(address_secret).unwrap());

    // Keys presented wrongly: a flipped character, a prefix, other keys'
    // secrets glued to a real key id.
    let genuine = worker_key.secret.expose();
    let mut flipped = genuine.to_owned();
    let last = if flipped.ends_with('0') { "1" } else { "0" };
    flipped.replace_range(flipped.len() - 1.., last);
    secrets.push(flipped.as_bytes().to_vec());
    let glued = format!(
        "{}{}",
        &genuine[..21],
        &setup.admin_key.secret.expose()[21..]
    );
    for presented in [
        flipped.clone(),
        format!("Bearer {genuine}"),
        glued,
        format!("{genuine} "),
    ] {
        surface.result(store.authenticate(Some(&presented)));
    }

    // A working day, with every kind of failure along the way.
    let q = queue("frames");
    for n in 0..3 {
        setup.enqueue_one(&worker, &prod, &q, n);
    }
    let Some(ClaimOutcome::Granted(claimed)) = surface.result(store.claim(&worker, &prod, &q))
    else {
        panic!("claimable");
    };
    let token = claimed.lease.token();
    surface.result(store.heartbeat(&worker, &claimed.task, token));
    let key = IdempotencyKey::parse("k").unwrap();
    surface.result(store.submit(&worker, &claimed.task, token, &key, &Output::bytes("a")));
    surface.result(store.submit(&worker, &claimed.task, token, &key, &Output::bytes("b")));
    surface.result(store.heartbeat(&worker, &claimed.task, token));
    surface.result(store.read_task(&worker, &claimed.task));
    surface.result(store.read_receipt(&worker, &claimed.task, AttemptNumber::FIRST));
    surface.result(store.health(&worker, &namespace("elsewhere")));
    surface.result(store.create_key(&worker, &KeySpec::keyed("acme")));
    surface.result(store.list_keys(&setup.admin, &KeyFilter::default()));
    surface.result(store.revoke_key(&worker, &setup.admin_key.info.key_id));
    store.refuse_writes(true);
    surface.result(store.claim(&worker, &prod, &q));
    surface.result(store.create_key(&setup.admin, &KeySpec::keyed("acme")));
    store.refuse_writes(false);
    let session_caller = store
        .authenticate(Some(session.key.secret.expose()))
        .unwrap();
    surface.result(store.claim(&session_caller, &session.namespace, &queue("practice")));
    surface.result(store.hash_address(address));
    store.revoke_key(&setup.admin, worker.key_id()).unwrap();
    surface.result(store.authenticate(Some(genuine)));
    surface.result(store.recheck(&worker));
    let page = surface
        .result(store.audit(&setup.admin, &AuditQuery::default()))
        .unwrap();
    surface.json(&page);
    assert!(!page.counters.is_empty() && !page.events.is_empty());
    surface.debug(&store.meter());

    for text in &surface.texts {
        for secret in &secrets {
            assert!(!contains(text.as_bytes(), secret), "a secret in: {text}");
        }
    }
    // Nor in what the database is stored in (SQLite: the file, its WAL or
    // its shared memory, before or after the log is folded back into the
    // database; PostgreSQL: every row as the server shows it). Neither is
    // the raw address.
    let check_file = |secrets: &[Vec<u8>]| {
        let bytes = db.stored_bytes();
        assert!(bytes.len() > 1024, "{} bytes stored", bytes.len());
        for secret in secrets {
            assert!(!contains(&bytes, secret), "a secret in the database files");
        }
        assert!(!contains(&bytes, address.to_string().as_bytes()));
    };
    check_file(&secrets);
    drop(setup);
    db.checkpoint();
    check_file(&secrets);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

conformance! {
    every_operation_against_every_kind_of_key,
    a_public_namespace_is_the_only_health_read_without_a_key,
    secrets_never_reach_an_error_a_debug_string_an_audit_row_or_the_file,
}
