//! How `init` decides, shared by every role that must explain or predict it (the sidecar's
//! restore checks, `status`, the incident commands): [`types`] (what a decision is),
//! [`upgrade`] (the release gate, reading only the types) and [`decide`] (the pure decision,
//! built on both). No I/O, no clock.

pub mod decide;
pub mod point;
pub mod types;
pub mod upgrade;

pub use decide::{decide, formation_token};
pub use point::{parse_restore_point, restore_point, snapshot_choice, time_point};
pub use types::*;
