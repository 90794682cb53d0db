//! Data-race detection for dsm, after Perkovic & Keleher, "Online Data-Race Detection via
//! Coherency Guarantees": accesses are recorded into per-page bitmaps for the current
//! interval ([`record`]); at each barrier the master finds concurrent interval pairs from
//! their vector timestamps, narrows them to pages where one writes and the other reads or
//! writes, fetches exactly those bitmaps and compares them ([`detect`]); races are printed
//! and logged ([`report`]). Everything here is sans-I/O: the DSM moves the data.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
pub mod detect;
pub mod incremental;
pub mod pinpoint;
pub mod record;
pub mod report;
pub mod suppress;

pub use check::{Checker, Finding, FindingKind, RegionRule};
pub use detect::{
    first_races, plan, plan_fresh, plan_pairwise, plan_with, set_code_resolver, Access, Bitmaps,
    CodeResolver, Plan, Race, RaceClass, RaceKind, VarInfo, VarTable,
};
pub use dsm_proto::PlanStats;
pub use incremental::Incremental;
pub use record::{granule_shift, AllocShadow, RecordStats, Recorder, Site};
pub use report::{Point, Reporter};
pub use suppress::{SuppressionError, Suppressions};
