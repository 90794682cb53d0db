//! Names the function of a race's source line, on rank 0, from the program's own debug
//! information. A recorded access knows its `file:line:column` (`#[track_caller]`) but not
//! its function; the view accessors are inlined into the caller, so the executable's
//! DWARF has, for every inlined accessor, the call site (`DW_AT_call_line`) and the calling
//! function. One pass over the line table indexes those call sites the first time a race
//! is reported; a line the index lacks (an accessor that was not inlined) gets a pass of
//! its own, looking for the line itself. Results are kept, misses too, so each line costs
//! at most one pass. Nothing here runs unless a race is reported.

use dsm_proto::SourceSite;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// The accessors' source file: rows there belong to inlined view accessors.
const ACCESSORS: &str = "dsm-core/src/api/view.rs";

/// Function names by call site, for the race reporter.
pub(super) struct FunctionNames {
    exe: PathBuf,
    state: Mutex<State>,
}

/// By line: the calls of an accessor from it, as (the file as DWARF names it, the calling
/// function).
type CallSites = HashMap<u32, Vec<(String, String)>>;

/// Why the debug information could not be read.
type Failure = Box<dyn std::error::Error>;

#[derive(Default)]
struct State {
    /// Whether the accessors' call sites were indexed (or could not be).
    indexed: bool,
    call_sites: CallSites,
    /// Answers so far, by (file as the report names it, line).
    known: HashMap<(String, u32), Option<String>>,
}

/// `dwarf` (a path as the debug information gives it) is the report's `file`, a path
/// relative to the workspace or absolute.
fn same_file(dwarf: &str, file: &str) -> bool {
    dwarf == file
        || dwarf
            .strip_suffix(file)
            .is_some_and(|head| head.ends_with('/'))
}

impl FunctionNames {
    /// Names functions from the debug information of `exe` (this program).
    pub(super) fn new(exe: PathBuf) -> Self {
        FunctionNames {
            exe,
            state: Mutex::new(State::default()),
        }
    }

    /// The function containing the access at `site`, when the debug information says.
    pub(super) fn name(&self, site: &SourceSite) -> Option<String> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let key = (site.file.clone(), site.line);
        if let Some(known) = s.known.get(&key) {
            return known.clone();
        }
        // The executable is opened once for this lookup, whichever passes it needs.
        let loader = std::cell::OnceCell::new();
        let open = || {
            loader
                .get_or_init(|| {
                    addr2line::Loader::new(&self.exe)
                        .map_err(|e| tracing::debug!("no function names for race reports: {e}"))
                        .ok()
                })
                .as_ref()
        };
        if !s.indexed {
            s.indexed = true;
            if let Some(l) = open() {
                match call_sites(l) {
                    Ok(sites) => s.call_sites = sites,
                    Err(e) => tracing::debug!("no function names for race reports: {e}"),
                }
            }
        }
        let indexed = s
            .call_sites
            .get(&site.line)
            .and_then(|v| v.iter().find(|(f, _)| same_file(f, &site.file)))
            .map(|(_, function)| function.clone());
        let found = indexed.or_else(|| open().and_then(|l| line_function(l, site).ok().flatten()));
        s.known.insert(key, found.clone());
        found
    }
}

/// Every call site of an inlined view accessor: the line it was called from, in which
/// file and function.
fn call_sites(loader: &addr2line::Loader) -> Result<CallSites, Failure> {
    let mut sites = CallSites::new();
    let mut last_range = None;
    for (addr, len, loc) in loader.find_location_range(0, u64::MAX)? {
        if !loc.file.is_some_and(|f| f.ends_with(ACCESSORS)) || last_range == Some((addr, len)) {
            continue;
        }
        last_range = Some((addr, len));
        let mut frames = loader.find_frames(addr)?;
        while let Some(frame) = frames.next()? {
            let Some(at) = frame.location else { continue };
            let (Some(file), Some(line)) = (at.file, at.line) else {
                continue;
            };
            if file.ends_with(ACCESSORS) {
                continue;
            }
            if let Some(function) = frame.function.as_ref().and_then(|f| f.demangle().ok()) {
                let entry = sites.entry(line).or_default();
                if !entry.iter().any(|(f, _)| f == file) {
                    entry.push((file.to_string(), function.into_owned()));
                }
            }
            break;
        }
    }
    Ok(sites)
}

/// The function with code at `site`'s line itself (an accessor called, not inlined).
fn line_function(loader: &addr2line::Loader, site: &SourceSite) -> Result<Option<String>, Failure> {
    for (addr, _, loc) in loader.find_location_range(0, u64::MAX)? {
        if loc.line != Some(site.line) || !loc.file.is_some_and(|f| same_file(f, &site.file)) {
            continue;
        }
        let mut frames = loader.find_frames(addr)?;
        while let Some(frame) = frames.next()? {
            let at = frame.location.as_ref();
            if at.and_then(|l| l.line) == Some(site.line)
                && at
                    .and_then(|l| l.file)
                    .is_some_and(|f| same_file(f, &site.file))
            {
                return Ok(frame
                    .function
                    .as_ref()
                    .and_then(|f| f.demangle().ok())
                    .map(|f| f.into_owned()));
            }
        }
    }
    Ok(None)
}
