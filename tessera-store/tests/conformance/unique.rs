//! Partition keys and unique tasks, through the public API.

use tessera_store::lease::StateName;
use tessera_store::{Brief, EnqueueOptions, Grant, PartitionKey, TaskQuery};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue, task_id};

fn partition(name: &str) -> PartitionKey {
    PartitionKey::parse(name).expect("a valid partition key")
}

fn a_partition_key_is_stored_and_shown_by_the_task_view_and_listings(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let keyed = f
        .store
        .enqueue(
            &worker,
            &ns,
            &q,
            &json_brief(1),
            &EnqueueOptions::default()
                .with_task_id(task_id(1))
                .with_partition_key(partition("customer-7")),
        )
        .unwrap();
    let plain = f.enqueue_one(&worker, &ns, &q, 2);
    let batch = f
        .store
        .enqueue_batch(
            &worker,
            &ns,
            &q,
            &[(
                Brief::Bytes(b"x".to_vec()),
                EnqueueOptions::default()
                    .with_task_id(task_id(3))
                    .with_partition_key(partition("customer-8")),
            )],
        )
        .unwrap();
    assert!(batch[0].created);

    let view = f.store.read_task(&worker, &keyed).unwrap();
    assert_eq!(view.partition_key, Some(partition("customer-7")));
    assert_eq!(view.unique_key, None);
    let view = f.store.read_task(&worker, &plain).unwrap();
    assert_eq!(view.partition_key, None);
    let view = f.store.read_task(&worker, &batch[0].task).unwrap();
    assert_eq!(view.partition_key, Some(partition("customer-8")));

    let listed = f
        .store
        .list_tasks(&worker, &ns, &TaskQuery::new(StateName::Ready))
        .unwrap();
    let keys: Vec<_> = listed
        .tasks
        .iter()
        .map(|listing| (listing.task.id.clone(), listing.partition_key.clone()))
        .collect();
    assert_eq!(
        keys,
        vec![
            (task_id(1), Some(partition("customer-7"))),
            (task_id(2), None),
            (task_id(3), Some(partition("customer-8"))),
        ]
    );
    // The claim keeps it.
    let claimed = f.claim(&worker, &ns, &q);
    assert_eq!(claimed.task, keyed);
    let view = f.store.read_task(&worker, &keyed).unwrap();
    assert_eq!(view.partition_key, Some(partition("customer-7")));
}

conformance! {
    a_partition_key_is_stored_and_shown_by_the_task_view_and_listings,
}
