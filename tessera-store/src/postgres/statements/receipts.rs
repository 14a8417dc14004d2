//! Receipts, each kept in the row of the attempt it ended: its number,
//! token and holder are the receipt's attempt, token and principal.

/// A receipt's columns, in [`receipt_row`] names.
///
/// [`receipt_row`]: crate::postgres::rows::receipt_row
macro_rules! receipt_columns {
    () => {
        "number AS attempt, token, holder AS principal, idempotency_key, digest, accepted_at, \
         output"
    };
}
pub(in crate::postgres) const RECEIPT_BY_KEY: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM attempts WHERE task = $2 AND holder = $1 AND idempotency_key = $3"
);
pub(in crate::postgres) const RECEIPTS_OF_ATTEMPT: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM attempts WHERE task = $1 AND number = $2 AND idempotency_key IS NOT NULL"
);
pub(in crate::postgres) const RECEIPTS_OF_TASK: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM attempts WHERE task = $1 AND idempotency_key IS NOT NULL ORDER BY number LIMIT $2"
);
