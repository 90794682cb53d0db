//! The comm thread: a single-threaded tokio runtime that owns the protocol engine and
//! drives it from three sources (faults handed over by the SIGSEGV handler, commands from
//! the app thread, messages from peers) and carries out what it answers (send messages,
//! release the faulting thread, reply to the app thread). A fatal protocol condition (a
//! lost peer, malformed traffic) ends the process with a message naming the cause: the
//! app thread may be parked in the fault handler, and the job cannot continue anyway.

use crate::engine::{Command, Engine, Memory, Output, Reply};
use crate::sys::{self, FaultMailbox, Prot, Segment, PAGE_SIZE};
use dsm_net::launcher::PEER_LOST_EXIT;
use dsm_net::{Mesh, NodeId, PageNo, PeerEvent, Transport};
use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::mpsc;

/// Exit status of a node the runtime stops because the job cannot go on.
pub const FATAL_EXIT: i32 = 70;

/// [`Memory`] over the mapped segment.
pub struct SegmentMemory {
    seg: &'static Segment,
}

impl SegmentMemory {
    pub fn new(seg: &'static Segment) -> Self {
        SegmentMemory { seg }
    }
}

impl Memory for SegmentMemory {
    fn protect(&mut self, first: PageNo, count: u32, prot: Prot) {
        if let Err(e) = self.seg.protect(first as usize, count as usize, prot) {
            // ENOMEM here almost always means the process hit vm.max_map_count.
            fatal(&format!(
                "cannot change page protection ({e}); if this says 'Cannot allocate memory', \
                 raise vm.max_map_count (sysctl) or use fewer, larger allocations"
            ));
        }
    }

    fn read_page(&self, page: PageNo, out: &mut [u8]) {
        self.seg.read_page(page as usize, out);
    }

    fn write_page(&mut self, page: PageNo, data: &[u8]) {
        self.seg.write_bytes(page as usize, 0, data);
    }

    fn apply_diff(&mut self, page: PageNo, diff: &[u8]) {
        for run in crate::diff::runs(diff) {
            let (offset, bytes) = run.expect("diffs are validated before they are applied");
            self.seg.write_bytes(page as usize, offset, bytes);
        }
    }

    fn make_diff(&self, page: PageNo, twin: &[u8]) -> Vec<u8> {
        self.seg
            .with_page(page as usize, |cur| crate::diff::create(twin, cur))
    }
}

/// Prints a fatal error and ends the process at once.
pub fn fatal(msg: &str) -> ! {
    fatal_with(msg, FATAL_EXIT)
}

fn fatal_with(msg: &str, code: i32) -> ! {
    report_fatal(msg);
    sys::exit_now(code)
}

/// Writes the message in one `write`, so a signal arriving meanwhile cannot cut the line.
/// Not stdout: the app thread may hold its lock while parked in a fault, and stdout is
/// line-buffered, so complete lines are already out.
fn report_fatal(msg: &str) {
    use std::io::Write;
    let line = format!("dsm: fatal: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// The app thread's handle on the comm thread.
pub struct Comm {
    commands: mpsc::UnboundedSender<Command>,
    replies: std_mpsc::Receiver<Reply>,
    thread: Option<JoinHandle<()>>,
}

/// Carries engine outputs out to the world.
struct Dispatch {
    /// Taken out at shutdown; sends after that are dropped (nobody is listening).
    transport: RefCell<Option<Transport>>,
    /// Set once a fatal error is being reported: nothing else is processed.
    dying: std::cell::Cell<bool>,
    mailbox: FaultMailbox,
    replies: std_mpsc::Sender<Reply>,
}

impl Dispatch {
    fn run(&self, outputs: Vec<Output>) {
        for out in outputs {
            if self.dying.get() {
                return;
            }
            match out {
                Output::Send { to, msg } => {
                    let transport = self.transport.borrow();
                    let Some(t) = transport.as_ref() else {
                        continue;
                    };
                    if let Err(e) = t.send(to as usize, &msg) {
                        fatal_with(
                            &format!(
                                "rank {}: cannot send {} to rank {to}: {e}",
                                t.rank(),
                                msg.kind()
                            ),
                            PEER_LOST_EXIT,
                        );
                    }
                }
                Output::FaultResolved => self.mailbox.resolve(),
                Output::FaultCrash => self.mailbox.crash(),
                Output::Reply(mut r) => {
                    if let Reply::Stats(s) = &mut r {
                        if let Some(t) = self.transport.borrow().as_ref() {
                            s.messages_sent = t.traffic.messages_sent.get();
                            s.bytes_sent = t.traffic.bytes_sent.get();
                            s.messages_received = t.traffic.messages_received.get();
                            s.bytes_received = t.traffic.bytes_received.get();
                        }
                    }
                    // The app thread only goes away at process exit.
                    let _ = self.replies.send(r);
                }
                Output::Fatal(msg) => self.die(msg, FATAL_EXIT),
                Output::PeerLost(msg) => fatal_with(&msg, PEER_LOST_EXIT),
            }
        }
    }
}

impl Dispatch {
    /// Reports a fatal error, lets already queued messages (such as an abort notice to the
    /// other nodes) go out for a moment, then ends the process.
    fn die(&self, msg: String, code: i32) {
        self.dying.set(true);
        report_fatal(&msg);
        let transport = self.transport.borrow_mut().take();
        tokio::task::spawn_local(async move {
            if let Some(t) = transport {
                t.shutdown(Duration::from_millis(500)).await;
            }
            sys::exit_now(code)
        });
    }
}

impl Comm {
    /// Starts the comm thread with the engine and the established mesh.
    pub fn start(
        mesh: Mesh,
        engine: Engine<SegmentMemory>,
        mailbox: FaultMailbox,
        seg: &'static Segment,
    ) -> io::Result<Comm> {
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (reply_tx, reply_rx) = std_mpsc::channel();
        let rank = mesh.rank;
        let thread = std::thread::Builder::new()
            .name(format!("dsm-comm-{rank}"))
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    comm_main(mesh, engine, mailbox, seg, cmd_rx, reply_tx)
                }));
                match result {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => fatal(&format!("rank {rank}: comm thread failed: {e}")),
                    Err(_) => fatal(&format!("rank {rank}: comm thread panicked")),
                }
            })?;
        Ok(Comm {
            commands: cmd_tx,
            replies: reply_rx,
            thread: Some(thread),
        })
    }

    /// Sends a command without waiting.
    pub fn send(&self, cmd: Command) {
        if self.commands.send(cmd).is_err() {
            fatal("the comm thread has stopped");
        }
    }

    /// Waits for the next reply.
    pub fn recv(&self) -> Reply {
        match self.replies.recv() {
            Ok(r) => r,
            Err(_) => fatal("the comm thread has stopped"),
        }
    }

    /// Sends a command and waits for its reply.
    pub fn call(&self, cmd: Command) -> Reply {
        self.send(cmd);
        self.recv()
    }

    /// Stops the comm thread after it has flushed what it still has to send.
    pub fn shutdown(mut self) {
        let (closed, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.commands, closed));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn page_of(seg: &Segment, addr: usize) -> Option<PageNo> {
    let base = seg.app_base();
    (addr >= base && addr < base + seg.len()).then(|| ((addr - base) / PAGE_SIZE) as PageNo)
}

fn comm_main(
    mesh: Mesh,
    engine: Engine<SegmentMemory>,
    mut mailbox: FaultMailbox,
    seg: &'static Segment,
    mut commands: mpsc::UnboundedReceiver<Command>,
    replies: std_mpsc::Sender<Reply>,
) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let engine = Rc::new(RefCell::new(engine));
        let kicks = tokio::net::UnixStream::from_std(
            mailbox
                .take_receiver()
                .ok_or_else(|| io::Error::other("fault mailbox receiver already taken"))?,
        )?;
        let dispatch = Rc::new(Dispatch {
            transport: RefCell::new(None),
            dying: std::cell::Cell::new(false),
            mailbox,
            replies,
        });

        let (e, d) = (engine.clone(), dispatch.clone());
        let on_peer = Rc::new(move |peer: usize, ev: PeerEvent| {
            let outputs = {
                let mut eng = e.borrow_mut();
                match ev {
                    PeerEvent::Message(msg) => eng.on_peer_message(peer as NodeId, msg),
                    PeerEvent::Closed => eng.on_peer_lost(peer as NodeId, "connection closed"),
                    PeerEvent::Failed(err) => eng.on_peer_lost(peer as NodeId, &err.to_string()),
                }
            };
            d.run(outputs);
        });
        let transport = Transport::start(mesh, on_peer)?;
        *dispatch.transport.borrow_mut() = Some(transport);

        let (e, d) = (engine.clone(), dispatch.clone());
        tokio::task::spawn_local(async move {
            let mut drain = [0u8; 64];
            loop {
                if let Err(err) = kicks.readable().await {
                    fatal(&format!("fault mailbox failed: {err}"));
                }
                // Drain the kicks before looking at the slot: a fault posted after this
                // point sends a fresh kick, so none is lost.
                match kicks.try_read(&mut drain) {
                    Ok(0) => fatal("fault mailbox closed"),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => fatal(&format!("fault mailbox failed: {e}")),
                }
                if let Some(fault) = d.mailbox.take() {
                    let outputs = e
                        .borrow_mut()
                        .on_fault(page_of(seg, fault.addr), fault.write);
                    d.run(outputs);
                }
            }
        });

        while let Some(cmd) = commands.recv().await {
            let outputs = engine.borrow_mut().on_command(cmd);
            dispatch.run(outputs);
        }
        // The app is done: flush what is queued, then let the connections close.
        let transport = dispatch.transport.borrow_mut().take();
        if let Some(t) = transport {
            t.shutdown(Duration::from_secs(5)).await;
        }
        Ok::<(), io::Error>(())
    })
}
