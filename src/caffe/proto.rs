//! The messages of Caffe's binary files (`.caffemodel`, `.binaryproto`) that p2ptrain reads and
//! writes, declared for prost with the field numbers of Caffe's `caffe.proto` (BVLC master).
//! Only the fields p2ptrain uses are declared; prost skips the others when decoding.
//!
//! ```text
//! NetParameter      { name = 1, layers = 2 (V1LayerParameter, legacy), layer = 100 }
//! LayerParameter    { name = 1, type = 2, bottom = 3, top = 4, loss_weight = 5, blobs = 7,
//!                     include = 8, phase = 10 }
//! NetStateRule      { phase = 1 (TRAIN = 0, TEST = 1) }
//! BlobProto         { num = 1, channels = 2, height = 3, width = 4 (legacy dimensions),
//!                     data = 5 (packed float), diff = 6, shape = 7, double_data = 8 }
//! BlobShape         { dim = 1 (packed int64) }
//! V1LayerParameter  { name = 4 }
//! ```
//!
//! `BlobProto` and `BlobShape` are `data::mean_file`'s (a mean image is one blob), shared here.

use prost::Message;

pub use crate::data::mean_file::{BlobProto, BlobShape};

/// `NetStateRule`: the phase a layer is included in or excluded from.
#[derive(Clone, PartialEq, Message)]
pub struct NetStateRule {
    #[prost(int32, optional, tag = "1")]
    pub phase: Option<i32>,
}

/// Caffe's `Phase` values.
pub const PHASE_TRAIN: i32 = 0;
/// Caffe's `Phase` values.
pub const PHASE_TEST: i32 = 1;

/// `LayerParameter`: a layer's name, type, wiring and learned blobs.
#[derive(Clone, PartialEq, Message)]
pub struct LayerParameter {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub r#type: Option<String>,
    #[prost(string, repeated, tag = "3")]
    pub bottom: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub top: Vec<String>,
    #[prost(float, repeated, packed = "false", tag = "5")]
    pub loss_weight: Vec<f32>,
    #[prost(message, repeated, tag = "7")]
    pub blobs: Vec<BlobProto>,
    #[prost(message, repeated, tag = "8")]
    pub include: Vec<NetStateRule>,
    #[prost(int32, optional, tag = "10")]
    pub phase: Option<i32>,
}

/// `V1LayerParameter`, the legacy layer message: read only to name it in an error.
#[derive(Clone, PartialEq, Message)]
pub struct V1LayerParameter {
    #[prost(string, optional, tag = "4")]
    pub name: Option<String>,
}

/// `NetParameter`: a whole net (a `.caffemodel` is one, with the blobs filled in).
#[derive(Clone, PartialEq, Message)]
pub struct NetParameter {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(message, repeated, tag = "2")]
    pub layers: Vec<V1LayerParameter>,
    #[prost(message, repeated, tag = "100")]
    pub layer: Vec<LayerParameter>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes written by hand from the wire format: a net named "n" with one layer "ip" of type
    /// "InnerProduct" holding one blob of shape (2) and values [1.0, -2.0] (packed floats).
    #[test]
    fn decodes_the_wire_format_with_caffes_field_numbers() {
        let blob = [
            0x2a, 0x08, 0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0, // data (5): 1.0, -2.0
            0x3a, 0x03, 0x0a, 0x01, 0x02, // shape (7) { dim (1): packed [2] }
        ];
        let mut layer = vec![0x0a, 0x02, b'i', b'p', 0x12, 12];
        layer.extend_from_slice(b"InnerProduct");
        layer.extend_from_slice(&[0x3a, blob.len() as u8]);
        layer.extend_from_slice(&blob);
        let mut net = vec![0x0a, 0x01, b'n', 0xa2, 0x06, layer.len() as u8];
        net.extend_from_slice(&layer);
        let decoded = NetParameter::decode(&net[..]).unwrap();
        assert_eq!(decoded.name.as_deref(), Some("n"));
        let l = &decoded.layer[0];
        assert_eq!(
            (l.name.as_deref(), l.r#type.as_deref()),
            (Some("ip"), Some("InnerProduct"))
        );
        assert_eq!(l.blobs[0].dims(), [2]);
        assert_eq!(l.blobs[0].values(), [1.0, -2.0]);
        assert_eq!(
            decoded.encode_to_vec(),
            net,
            "fields in tag order: the same bytes back"
        );
    }

    #[test]
    fn legacy_dimensions_win_over_shape() {
        let b = BlobProto {
            num: Some(1),
            channels: Some(1),
            height: Some(3),
            width: Some(4),
            double_data: vec![0.5; 12],
            ..Default::default()
        };
        assert_eq!(b.dims(), [1, 1, 3, 4]);
        assert_eq!(b.values(), vec![0.5f32; 12]);
    }
}
