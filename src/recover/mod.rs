//! Recovery from the freshest surviving volume when a majority is lost: the pure
//! [`plan`], and the `etcd-steward recover` command that prints it and, with `--yes`, hands
//! it to every pod; and `restore --snapshot` (`to_snapshot`), which takes a live cluster
//! back to a snapshot through the same pods.

pub mod command;
pub mod plan;
pub mod to_snapshot;
