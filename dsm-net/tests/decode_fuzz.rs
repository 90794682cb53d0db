//! The frame decoder under arbitrary input: whatever bytes arrive, decoding any message
//! type of the protocol returns a value or an error, never panics, and a frame's length
//! prefix cannot make the reader allocate beyond its limit. Seeded by proptest;
//! `PROPTEST_CASES` runs more.

use dsm_net::framing::read_frame;
use dsm_net::{decode, WireError};
use dsm_proto::{Hello, HelloProof, HelloReply, Msg};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode::<Msg>(&bytes);
        let _ = decode::<Hello>(&bytes);
        let _ = decode::<HelloReply>(&bytes);
        let _ = decode::<HelloProof>(&bytes);
    }

    #[test]
    fn arbitrary_streams_never_panic_the_frame_reader(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        match read_frame::<_, Msg>(&mut bytes.as_slice(), 256) {
            Ok(_) | Err(WireError::Malformed(_)) | Err(WireError::Io(_)) | Err(WireError::Closed) => {}
            Err(WireError::TooLarge { len, max }) => prop_assert!(len > max),
        }
    }
}
