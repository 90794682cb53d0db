//! A [`Memory`] over plain vectors: the engine without a mapped segment, for the protocol
//! simulator, the fuzz harness and any tool that wants to run the protocol in memory.

use super::{Memory, Prot};
use dsm_proto::{NodeId, PageNo, PAGE_SIZE};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The table a host's nodes share of the diffs applied to its pages
/// ([`Memory::host_applied`]).
pub type HostApplied = Arc<Mutex<BTreeMap<(PageNo, NodeId), u32>>>;

/// Pages in a `Vec<u8>` and their protections in a `Vec<Prot>`; what the real segment's
/// app view would enforce is left to the caller (check `prot` before an access).
#[derive(Debug, Clone)]
pub struct VecMemory {
    /// The pages' bytes, `pages * PAGE_SIZE` long.
    pub data: Vec<u8>,
    /// Each page's protection as the engine last set it.
    pub prot: Vec<Prot>,
    /// With one memory per host: the table the nodes of the host share (set it to the
    /// same one in each).
    pub host_applied: Option<HostApplied>,
}

impl VecMemory {
    /// `pages` zeroed, inaccessible pages.
    pub fn new(pages: usize) -> VecMemory {
        VecMemory {
            data: vec![0; pages * PAGE_SIZE],
            prot: vec![Prot::None; pages],
            host_applied: None,
        }
    }

    fn page(&self, page: PageNo) -> &[u8] {
        let s = page as usize * PAGE_SIZE;
        &self.data[s..s + PAGE_SIZE]
    }

    fn page_mut(&mut self, page: PageNo) -> &mut [u8] {
        let s = page as usize * PAGE_SIZE;
        &mut self.data[s..s + PAGE_SIZE]
    }
}

impl Memory for VecMemory {
    fn protect(&mut self, first: PageNo, count: u32, prot: Prot) {
        for p in first..first + count {
            self.prot[p as usize] = prot;
        }
    }

    fn read_page(&self, page: PageNo, out: &mut [u8]) {
        out.copy_from_slice(self.page(page));
    }

    fn write_page(&mut self, page: PageNo, data: &[u8]) {
        self.page_mut(page).copy_from_slice(data);
    }

    fn apply_diff(&mut self, page: PageNo, diff: &[u8]) {
        // The engine validates diffs before it applies them (`apply_diff_to` there).
        super::apply_diff_to(self.page_mut(page), diff)
            .expect("diffs are validated before they are applied");
    }

    fn make_diff(&self, page: PageNo, twin: &[u8]) -> Vec<u8> {
        crate::diff::create(twin, self.page(page))
    }

    fn host_applied(&self, page: PageNo, writer: NodeId) -> u32 {
        self.host_applied.as_ref().map_or(0, |t| {
            let t = t.lock().expect("no test panics holding the table");
            t.get(&(page, writer)).copied().unwrap_or(0)
        })
    }

    fn publish_host_applied(&mut self, page: PageNo, writer: NodeId, interval: u32) {
        if let Some(t) = &self.host_applied {
            let mut t = t.lock().expect("no test panics holding the table");
            let e = t.entry((page, writer)).or_default();
            *e = (*e).max(interval);
        }
    }
}
