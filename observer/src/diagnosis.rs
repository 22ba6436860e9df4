//! From events to a diagnosis: [`evidence`] says what each event proves,
//! [`estimate`] holds the interval and point rules, [`probed`] takes what
//! `observer probe` measured, [`verdict`] judges a
//! destination, [`aggregate`] keeps the per-row state, [`clients`] puts the
//! fix in each client runtime's own setting, [`key`] is a row's one key
//! (destination, role, [`key::Netns`]), and [`table`] is the row itself
//! and its selection. Pure logic: no I/O.

pub mod aggregate;
pub mod clients;
pub mod estimate;
pub mod evidence;
pub mod key;
pub mod probed;
pub mod table;
pub mod verdict;
