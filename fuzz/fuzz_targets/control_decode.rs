//! Any bytes a peer sends on a control socket (the manager reads stacks',
//! a stack reads the manager's): decoding never panics, and what decodes
//! encodes back to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xio_core::proto::Msg;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Msg::decode(data) {
        let again = Msg::decode(&m.encode()).expect("an encoded message decodes");
        assert_eq!(again, m);
    }
});
