//! Message encoding and framing: postcard payloads behind a 4-byte big-endian length, with a
//! maximum frame size so a corrupt or hostile length cannot make a node allocate gigabytes.
//! The same framing serves the blocking bootstrap (std sockets) and the async transport
//! ([`next_frame`] over the reader task's buffer).

use bytes::{Buf, BytesMut};
use dsm_proto::{PageNo, PlainPageReply, PlainPageRequest, PAGE_SIZE, PLAIN_REPLY_APPLIED_MAX};
use serde::{de::DeserializeOwned, Serialize};
use std::io::{self, Read, Write};
use thiserror::Error;

/// Largest frame a node sends or accepts, in payload bytes (the 4-byte length prefix not
/// counted): 256 MiB.
pub const MAX_FRAME: usize = 256 << 20;

/// Why a message could not be encoded, sent or received.
#[derive(Debug, Error)]
pub enum WireError {
    /// The payload does not decode as the expected message type (or has trailing bytes),
    /// or a value could not be serialized.
    #[error("malformed message: {0}")]
    Malformed(#[from] postcard::Error),
    /// A frame longer than allowed, sent or announced by a length prefix. The async
    /// transport's codec does not report the length, so there `len` is `usize::MAX`.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Payload bytes of the frame.
        len: usize,
        /// The limit that applied ([`MAX_FRAME`], or a smaller one for handshakes).
        max: usize,
    },
    /// The peer closed the connection where the next frame should have begun, or this
    /// side was asked to send on a link it has closed (or to a rank it has no link to).
    #[error("connection closed")]
    Closed,
    /// The socket failed (including read timeouts during the bootstrap).
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}

/// Serializes `msg` into a frame payload (postcard, without the length prefix). Fails with
/// [`WireError::TooLarge`] if the payload would exceed [`MAX_FRAME`], so an oversized
/// message is caught at the sender rather than refused by the receiver.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, WireError> {
    let bytes = postcard::serialize_with_flavor(msg, Payload(Vec::new()))?;
    within_frame_limit(bytes.len())?;
    Ok(bytes)
}

/// [`WireError::TooLarge`] for a payload of `len` bytes over [`MAX_FRAME`].
fn within_frame_limit(len: usize) -> Result<(), WireError> {
    if len > MAX_FRAME {
        return Err(WireError::TooLarge {
            len,
            max: MAX_FRAME,
        });
    }
    Ok(())
}

/// `msg` as a whole frame: the 4-byte big-endian length, then [`encode`]'s payload, built in
/// one buffer (a separate payload cost a copy and an allocation per message).
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, WireError> {
    let mut frame = postcard::serialize_with_flavor(msg, Payload(vec![0; 4]))?;
    let len = frame.len() - 4;
    within_frame_limit(len)?;
    frame[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(frame)
}

/// postcard's output as a `Vec`, taking the short pieces (a varint, a tag: most of a
/// message of intervals and notices) byte by byte: postcard's own `Vec` flavor copies each
/// with a call to `memcpy`, which costs more than the byte.
struct Payload(Vec<u8>);

impl postcard::ser_flavors::Flavor for Payload {
    type Output = Vec<u8>;

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if data.len() <= 16 {
            self.0.reserve(data.len());
            for &b in data {
                self.0.push(b);
            }
        } else {
            self.0.extend_from_slice(data);
        }
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// Decodes a whole frame; trailing garbage is an error, not silently ignored.
pub fn decode<T: DeserializeOwned>(frame: &[u8]) -> Result<T, WireError> {
    let (value, rest) = postcard::take_from_bytes(frame)?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(
            postcard::Error::DeserializeBadEncoding,
        ));
    }
    Ok(value)
}

/// The next whole frame's payload out of `buf` (the async transport's read buffer), if it
/// holds one; the same on-wire format as [`write_frame`]. A frame's 4-byte length prefix
/// stays in `buf` until the whole frame is there, so an empty `buf` means no partial
/// frame is held (tokio-util's length-delimited codec takes the prefix out first, which
/// is why this is not that codec). A length over [`MAX_FRAME`] is an error.
pub fn next_frame(buf: &mut BytesMut) -> Result<Option<BytesMut>, WireError> {
    let Some(prefix) = buf.first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(*prefix) as usize;
    if len > MAX_FRAME {
        return Err(WireError::TooLarge {
            len,
            max: MAX_FRAME,
        });
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    buf.advance(4);
    Ok(Some(buf.split_to(len)))
}

/// Blocking write of one frame (bootstrap only): the length prefix and the [`encode`]d
/// payload in a single write, then a flush.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> Result<(), WireError> {
    w.write_all(&encode_frame(msg)?)?;
    w.flush()?;
    Ok(())
}

/// Blocking read of one frame (bootstrap only), bounded by `max` payload bytes. Fails with
/// [`WireError::Closed`] on end-of-stream before the length prefix, [`WireError::TooLarge`]
/// when the prefix announces more than `max` (before allocating anything), and otherwise
/// as [`decode`] or the socket does.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R, max: usize) -> Result<T, WireError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(WireError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    decode(&payload)
}

/// Longest frame [`page_request_frame`] makes: the length prefix and the payload of a
/// [`PlainPageRequest`] for any page.
pub const PAGE_REQUEST_FRAME_MAX: usize = 16;

/// A whole frame (length prefix and payload) asking a page's home for `page`, exactly as
/// [`dsm_proto::Msg::PageRequest`] with that one page, no requirement and no lane would be
/// framed, written into `buf` without allocating (for a fault handler; see
/// [`crate::DirectSender`]). Returns the frame's part of `buf`.
pub fn page_request_frame(page: PageNo, buf: &mut [u8; PAGE_REQUEST_FRAME_MAX]) -> &[u8] {
    let (prefix, payload) = buf.split_at_mut(4);
    let len = postcard::to_slice(&PlainPageRequest(page), payload)
        .expect("a page request fits its buffer")
        .len();
    prefix.copy_from_slice(&(len as u32).to_be_bytes());
    &buf[..4 + len]
}

/// Longest frame (length prefix and payload) that [`plain_page_reply`] can accept: a
/// [`dsm_proto::Msg::PageReply`] of one page with [`PLAIN_REPLY_APPLIED_MAX`] entries,
/// every number at its longest encoding.
pub const PLAIN_REPLY_FRAME_MAX: usize =
    4 + 1 + 1 + 5 + 2 + PAGE_SIZE + 1 + PLAIN_REPLY_APPLIED_MAX * (3 + 5);

/// Reads a frame's payload as a [`dsm_proto::Msg::PageReply`] of exactly one whole page
/// without allocating (for a fault handler; see [`crate::DirectSender::try_take_frame`]).
/// `None` for anything else: another message, several pages, a page of the wrong size,
/// too many `applied` entries, or trailing bytes.
pub fn plain_page_reply(payload: &[u8]) -> Option<PlainPageReply<'_>> {
    let (reply, rest) = postcard::take_from_bytes::<PlainPageReply>(payload).ok()?;
    (rest.is_empty() && reply.data.len() == PAGE_SIZE).then_some(reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsm_proto::*;
    use proptest::prelude::*;

    #[test]
    fn a_page_request_frame_is_the_framed_message_it_stands_for() {
        let mut buf = [0u8; PAGE_REQUEST_FRAME_MAX];
        for page in [0, 1, 127, 128, 300, 16_383, 16_384, 1 << 21, PageNo::MAX] {
            let msg = Msg::PageRequest {
                pages: vec![page],
                required: Vec::new(),
                lane: false,
            };
            let mut framed = Vec::new();
            write_frame(&mut framed, &msg).unwrap();
            assert_eq!(
                page_request_frame(page, &mut buf),
                &framed[..],
                "page {page}"
            );
        }
    }

    fn one_page_reply(page: PageNo, fill: u8, applied: Vec<(NodeId, u32)>) -> Msg {
        Msg::PageReply {
            pages: vec![PageCopy {
                page,
                data: vec![fill; PAGE_SIZE],
                applied,
            }],
        }
    }

    proptest! {
        #[test]
        fn a_plain_page_reply_reads_what_the_derived_encoding_wrote(
            page in any::<u32>(),
            fill in any::<u8>(),
            applied in proptest::collection::vec(any::<(u16, u32)>(), 0..=PLAIN_REPLY_APPLIED_MAX),
        ) {
            let msg = one_page_reply(page, fill, applied.clone());
            let payload = encode(&msg).unwrap();
            prop_assert!(payload.len() + 4 <= PLAIN_REPLY_FRAME_MAX);
            let reply = plain_page_reply(&payload).expect("a plain reply");
            prop_assert_eq!(reply.page, page);
            prop_assert_eq!(reply.data, &[fill; PAGE_SIZE][..]);
            prop_assert_eq!(reply.applied(), &applied[..]);
            // Cut anywhere, it is no reply; with a byte more, neither.
            for cut in [0, 1, payload.len() / 2, payload.len() - 1] {
                prop_assert!(plain_page_reply(&payload[..cut]).is_none());
            }
            let mut longer = payload.clone();
            longer.push(0);
            prop_assert!(plain_page_reply(&longer).is_none());
        }

        #[test]
        fn no_other_message_reads_as_a_plain_page_reply(msg in arb_msg()) {
            let payload = encode(&msg).unwrap();
            let plain = matches!(&msg, Msg::PageReply { pages }
                if pages.len() == 1
                    && pages[0].data.len() == PAGE_SIZE
                    && pages[0].applied.len() <= PLAIN_REPLY_APPLIED_MAX);
            prop_assert_eq!(plain_page_reply(&payload).is_some(), plain);
        }
    }

    #[test]
    fn a_frame_leaves_the_buffer_only_whole_and_its_prefix_stays_until_then() {
        let mut wire = Vec::new();
        for msg in [Msg::Heartbeat, one_page_reply(3, 1, vec![])] {
            write_frame(&mut wire, &msg).unwrap();
        }
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for (i, byte) in wire.iter().enumerate() {
            buf.extend_from_slice(&[*byte]);
            while let Some(frame) = next_frame(&mut buf).unwrap() {
                got.push(decode::<Msg>(&frame).unwrap().kind());
                assert!(buf.is_empty() || i + 1 < wire.len());
            }
            // Whatever is held is the start of a frame, prefix included.
            assert!(buf.is_empty() || buf.len() <= wire.len() - got.len());
        }
        assert_eq!(got, ["heartbeat", "page-reply"]);
        assert!(buf.is_empty());
        let mut prefix_only = BytesMut::from(&wire[..4]);
        assert!(next_frame(&mut prefix_only).unwrap().is_none());
        assert_eq!(
            &prefix_only[..],
            &wire[..4],
            "the prefix stays until the frame is whole"
        );
        let mut huge = BytesMut::from(&((MAX_FRAME as u32) + 1).to_be_bytes()[..]);
        assert!(matches!(
            next_frame(&mut huge),
            Err(WireError::TooLarge { .. })
        ));
    }

    #[test]
    fn replies_that_are_not_plain_are_refused() {
        let two = Msg::PageReply {
            pages: vec![
                PageCopy {
                    page: 1,
                    data: vec![0; PAGE_SIZE],
                    applied: vec![],
                },
                PageCopy {
                    page: 2,
                    data: vec![0; PAGE_SIZE],
                    applied: vec![],
                },
            ],
        };
        let short_page = Msg::PageReply {
            pages: vec![PageCopy {
                page: 1,
                data: vec![0; 100],
                applied: vec![],
            }],
        };
        let crowded = one_page_reply(3, 0, vec![(1, 1); PLAIN_REPLY_APPLIED_MAX + 1]);
        let none = Msg::PageReply { pages: vec![] };
        for msg in [two, short_page, crowded, none, Msg::Heartbeat] {
            assert!(
                plain_page_reply(&encode(&msg).unwrap()).is_none(),
                "{msg:?}"
            );
        }
    }

    fn arb_vt() -> impl Strategy<Value = VectorTime> {
        proptest::collection::vec(0u32..1000, 1..9).prop_map(VectorTime::from)
    }

    fn arb_runs() -> impl Strategy<Value = PageRuns> {
        proptest::collection::vec(0u32..5000, 0..30).prop_map(PageRuns::from_pages)
    }

    fn arb_interval() -> impl Strategy<Value = IntervalRecord> {
        (
            0u16..8,
            1u32..100,
            arb_vt(),
            arb_runs(),
            proptest::option::of((arb_runs(), arb_runs())),
            0u32..7,
            any::<u64>(),
        )
            .prop_map(
                |(node, index, vt, writes, race, cause, lock)| IntervalRecord {
                    node,
                    index,
                    vt,
                    writes,
                    race: race.map(|(reads, writes)| RaceNotices {
                        reads,
                        writes,
                        ..Default::default()
                    }),
                    began_with: match cause {
                        0 => SyncCause::Start,
                        1 => SyncCause::Barrier(lock as u32),
                        2 => SyncCause::Acquire(lock),
                        3 => SyncCause::Release(lock),
                        4 => SyncCause::SemWait(lock),
                        5 => SyncCause::SemSignal(lock),
                        _ => SyncCause::SemTryFailed(lock),
                    },
                },
            )
    }

    fn arb_msg() -> impl Strategy<Value = Msg> {
        prop_oneof![
            (
                proptest::collection::vec(any::<u32>(), 0..10),
                proptest::collection::vec((any::<u32>(), any::<u16>(), any::<u32>()), 0..5),
                any::<bool>()
            )
                .prop_map(|(pages, req, lane)| Msg::PageRequest {
                    pages,
                    lane,
                    required: req
                        .into_iter()
                        .map(|(page, writer, interval)| Requirement {
                            page,
                            writer,
                            interval
                        })
                        .collect()
                }),
            any::<u32>().prop_map(|page| Msg::LanePageReply { page }),
            proptest::collection::vec(
                (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..64)),
                0..4
            )
            .prop_map(|v| Msg::PageReply {
                pages: v
                    .into_iter()
                    .map(|(page, data)| PageCopy {
                        page,
                        data,
                        applied: vec![(1, page)],
                    })
                    .collect()
            }),
            (
                any::<u32>(),
                proptest::collection::vec(
                    (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..64)),
                    0..4
                )
            )
                .prop_map(|(interval, v)| Msg::Diffs {
                    after: vec![Requirement {
                        page: interval,
                        writer: 1,
                        interval: 2,
                    }],
                    interval,
                    diffs: v
                        .into_iter()
                        .map(|(page, runs)| PageDiff { page, runs })
                        .collect()
                }),
            (
                proptest::collection::vec(any::<u64>(), 0..4),
                any::<u16>(),
                arb_vt()
            )
                .prop_map(|(locks, requester, known)| {
                    Msg::LockRequest {
                        locks,
                        requester,
                        known,
                    }
                }),
            (
                proptest::collection::vec(any::<u64>(), 0..4),
                any::<u16>(),
                arb_vt()
            )
                .prop_map(|(locks, requester, known)| {
                    Msg::LockForward {
                        locks,
                        requester,
                        known,
                    }
                }),
            proptest::collection::vec(
                (
                    any::<u64>(),
                    arb_vt(),
                    proptest::collection::vec(arb_interval(), 0..4),
                    any::<u64>()
                ),
                0..3
            )
            .prop_map(|grants| Msg::LockGrant {
                grants: grants
                    .into_iter()
                    .map(|(lock, known, intervals, grant)| Grant {
                        lock,
                        known,
                        intervals,
                        grant,
                        pages: Vec::new(),
                        diffs: vec![PushedDiff {
                            page: 3,
                            interval: 2,
                            runs: vec![0, 1, 2],
                        }],
                    })
                    .collect()
            }),
            (
                any::<u32>(),
                arb_vt(),
                proptest::collection::vec(arb_interval(), 0..4),
                any::<u64>(),
                any::<bool>(),
                proptest::collection::vec(
                    (
                        any::<u32>(),
                        any::<u32>(),
                        proptest::collection::vec(any::<u8>(), 0..16)
                    ),
                    0..3
                )
            )
                .prop_map(|(epoch, known, intervals, check, finishing, bm)| {
                    Msg::BarrierArrive {
                        epoch,
                        at: dsm_proto::SyncPoint::Allocation {
                            name: format!("a{epoch}"),
                            after: epoch / 2,
                        },
                        known,
                        intervals,
                        check,
                        finishing,
                        bitmaps: bm
                            .into_iter()
                            .map(|(interval, page, bits)| EncodedBitmap {
                                key: BitmapKey {
                                    interval,
                                    page,
                                    kind: AccessKind::Read,
                                },
                                bits,
                                sites: [SiteSpan {
                                    site: interval,
                                    first: 0,
                                    last: 3,
                                }]
                                .into_iter()
                                .collect(),
                                defs: vec![(
                                    interval,
                                    SourceSite {
                                        file: "src/a.rs".into(),
                                        line: page,
                                        column: 5,
                                        code: None,
                                    },
                                )],
                            })
                            .collect(),
                        pages: if finishing {
                            Vec::new()
                        } else {
                            vec![PushedPage {
                                page: epoch,
                                data: vec![7; 16],
                                applied: vec![(1, check as u32)],
                            }]
                        },
                    }
                }),
            (
                any::<u32>(),
                arb_vt(),
                proptest::collection::vec(arb_interval(), 0..4),
                any::<u64>()
            )
                .prop_map(|(epoch, known, intervals, races)| Msg::BarrierRelease {
                    epoch,
                    known,
                    intervals,
                    races
                }),
            ".{0,40}".prop_map(|reason| Msg::Abort { reason }),
            Just(Msg::Heartbeat),
            (any::<u64>(), any::<u32>()).prop_map(|(sem, seq)| Msg::SemSignal { sem, seq }),
            (any::<u64>(), arb_vt(), any::<bool>()).prop_map(|(sem, known, try_only)| {
                Msg::SemWait {
                    sem,
                    known,
                    try_only,
                }
            }),
            (any::<u64>(), any::<u32>(), any::<u16>(), arb_vt()).prop_map(
                |(sem, seq, waiter, known)| Msg::SemForward {
                    sem,
                    seq,
                    waiter,
                    known,
                }
            ),
            (
                any::<u64>(),
                proptest::option::of((any::<u16>(), any::<u32>())),
                arb_vt(),
                proptest::collection::vec(arb_interval(), 0..3)
            )
                .prop_map(|(sem, signal, known, intervals)| Msg::SemGrant {
                    sem,
                    signal,
                    known,
                    intervals,
                }),
            any::<u64>().prop_map(|sem| Msg::SemDenied { sem }),
            (
                any::<u32>(),
                proptest::collection::vec((any::<u32>(), any::<u32>(), any::<bool>()), 0..5)
            )
                .prop_map(|(epoch, keys)| Msg::BitmapRequest {
                    epoch,
                    wanted: keys
                        .into_iter()
                        .map(|(interval, page, w)| BitmapKey {
                            interval,
                            page,
                            kind: if w {
                                AccessKind::Write
                            } else {
                                AccessKind::Read
                            }
                        })
                        .collect()
                }),
        ]
    }

    proptest! {
        #[test]
        fn messages_roundtrip(msg in arb_msg()) {
            let bytes = encode(&msg).unwrap();
            let back: Msg = decode(&bytes).unwrap();
            prop_assert_eq!(back, msg);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            // Malformed frames must be errors, never panics or huge allocations.
            let _ = decode::<Msg>(&bytes);
        }

        #[test]
        fn truncated_frames_are_errors(msg in arb_msg(), cut in 0usize..1000) {
            let bytes = encode(&msg).unwrap();
            if cut < bytes.len() {
                prop_assert!(decode::<Msg>(&bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn heartbeat_is_one_byte_and_roundtrips() {
        let bytes = encode(&Msg::Heartbeat).unwrap();
        assert_eq!(bytes.len(), 1, "a heartbeat costs a 5-byte frame");
        assert_eq!(decode::<Msg>(&bytes).unwrap(), Msg::Heartbeat);
        assert_eq!(Msg::Heartbeat.kind(), "heartbeat");
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode(&Msg::Abort { reason: "x".into() }).unwrap();
        bytes.push(0);
        assert!(decode::<Msg>(&bytes).is_err());
    }

    #[test]
    fn oversized_frame_header_is_rejected_before_allocating() {
        let mut stream: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        match read_frame::<_, Msg>(&mut stream, MAX_FRAME) {
            Err(WireError::TooLarge { len, .. }) => assert_eq!(len, u32::MAX as usize),
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }

    #[test]
    fn blocking_frames_roundtrip() {
        let hello = Hello {
            magic: HELLO_MAGIC,
            version: PROTOCOL_VERSION,
            rank: 3,
            size: 4,
            listen: "127.0.0.1:1".into(),
            nonce: [7; 32],
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &hello).unwrap();
        let back: Hello = read_frame(&mut buf.as_slice(), MAX_FRAME).unwrap();
        assert_eq!(back, hello);
    }
}
