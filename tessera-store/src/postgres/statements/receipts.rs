//! The `receipts` table.

/// A receipt row's columns, in [`receipt_row`] order.
macro_rules! receipt_columns {
    () => {
        "attempt, token, principal, idempotency_key, artifact, digest, accepted_at, output"
    };
}
pub(in crate::postgres) const INSERT_RECEIPT: &str = "INSERT INTO receipts (task, attempt, token, principal, \
     idempotency_key, artifact, digest, accepted_at, output) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
pub(in crate::postgres) const RECEIPT_BY_KEY: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE principal = $1 AND task = $2 AND idempotency_key = $3"
);
pub(in crate::postgres) const RECEIPTS_OF_ATTEMPT: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE task = $1 AND attempt = $2 ORDER BY id"
);
pub(in crate::postgres) const RECEIPTS_OF_TASK: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE task = $1 ORDER BY attempt, id LIMIT $2"
);
