//! Recovery from the freshest surviving volume when a majority is lost: the pure
//! [`plan`], and the `etcd-steward recover` command that prints it and, with `--yes`, hands
//! it to every pod.

pub mod command;
pub mod plan;
