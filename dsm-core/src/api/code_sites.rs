//! Symbolises, on the reporting rank, the race sites that a ThreadSanitizer-ABI runtime
//! (dsm-capi) recorded as code addresses: the instrumented instruction's address relative
//! to the executable's load address, looked up in the executable's own debug
//! information. Each address is looked up once; nothing here runs unless such a site
//! takes part in a race report.

use dsm_proto::SourceSite;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// The resolver for `exe` (this program), for [`dsm_race::set_code_resolver`].
pub(super) fn resolver(exe: PathBuf) -> dsm_race::CodeResolver {
    let known: Mutex<HashMap<u64, Option<SourceSite>>> = Mutex::new(HashMap::new());
    Box::new(move |addr| {
        let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
        known
            .entry(addr)
            .or_insert_with(|| lookup(&exe, addr))
            .clone()
    })
}

/// The source line of the call at return address `ret`: the byte before it belongs to
/// the call instruction, whose line is the instrumented access's. The innermost frame
/// is the access's own line, inlined or not.
fn lookup(exe: &PathBuf, ret: u64) -> Option<SourceSite> {
    // The loader is opened per address (not kept): it is not `Send`, and the resolver
    // may be called from any thread. Reports name few distinct sites.
    let loader = addr2line::Loader::new(exe)
        .map_err(|e| tracing::debug!("no source lines for code addresses: {e}"))
        .ok()?;
    let probe = ret.checked_sub(1)?;
    let loc = loader.find_location(probe).ok().flatten()?;
    Some(SourceSite {
        file: loc.file?.to_string(),
        line: loc.line?,
        column: loc.column.unwrap_or(0),
        code: None,
    })
}
