//! The seam's read and write transactions on SQLite: each operation of
//! [`ReadTransaction`](crate::backend::ReadTransaction) and
//! [`WriteTransaction`](crate::backend::WriteTransaction) mapped onto the
//! functions of [`statements`](super::statements), and the rows they read
//! turned back into domain records. No SQL lives here.

mod reads;
mod writes;

use super::readers::Reader;
use super::statements::attempts;
use crate::backend::rows::TaskRow;
use crate::backend::{LoadedTask, Result};

/// A task row with its attempts.
fn load(reader: &Reader<'_>, row: TaskRow) -> Result<LoadedTask> {
    let attempts = attempts::attempts_of_task(reader, row.id)?;
    row.loaded(attempts)
}
