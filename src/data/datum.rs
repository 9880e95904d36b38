//! Caffe's `Datum`, the record of its LMDBs: written through prost by `p2ptrain
//! convert-imageset`, read without copying by [`DatumView`] (a wire-format scan that borrows the
//! pixel or file bytes from the memory map and can stop at the label without touching them).
//!
//! caffe.proto:
//!
//! ```text
//! message Datum {
//!   optional int32 channels = 1; optional int32 height = 2; optional int32 width = 3;
//!   optional bytes data = 4;            // u8 (C, H, W), or a whole JPEG/PNG file when encoded
//!   optional int32 label = 5;
//!   repeated float float_data = 6;      // (C, H, W) floats instead of `data`
//!   optional bool encoded = 7 [default = false];
//! }
//! ```

use prost::Message;

/// A `Datum` to serialize, fields in tag order (Caffe writes them in that order too).
#[derive(Clone, PartialEq, Message)]
pub struct Datum {
    #[prost(int32, optional, tag = "1")]
    pub channels: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub height: Option<i32>,
    #[prost(int32, optional, tag = "3")]
    pub width: Option<i32>,
    #[prost(bytes = "vec", optional, tag = "4")]
    pub data: Option<Vec<u8>>,
    #[prost(int32, optional, tag = "5")]
    pub label: Option<i32>,
    #[prost(float, repeated, packed = "false", tag = "6")]
    pub float_data: Vec<f32>,
    #[prost(bool, optional, tag = "7")]
    pub encoded: Option<bool>,
}

/// What a stored `Datum` holds, borrowed from its bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatumView<'a> {
    pub channels: i64,
    pub height: i64,
    pub width: i64,
    /// Field 4: raw pixels `(C, H, W)` or the encoded file.
    pub data: &'a [u8],
    pub label: i64,
    /// Field 6, packed or not: little-endian f32 words, possibly in several runs.
    pub float_data: Vec<&'a [u8]>,
    pub encoded: bool,
}

impl<'a> DatumView<'a> {
    /// Scans `bytes`; `Err` says what is malformed (a truncated field, an unknown wire type).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        let mut view = DatumView::default();
        let mut r = Reader { bytes, at: 0 };
        while !r.done() {
            let key = r.varint()?;
            let (tag, wire) = (key >> 3, key & 7);
            match (tag, wire) {
                (1, 0) => view.channels = r.int32()?,
                (2, 0) => view.height = r.int32()?,
                (3, 0) => view.width = r.int32()?,
                (4, 2) => view.data = r.delimited()?,
                (5, 0) => view.label = r.int32()?,
                (6, 5) => view.float_data.push(r.fixed32()?),
                (6, 2) => {
                    let run = r.delimited()?;
                    if run.len() % 4 != 0 {
                        return Err("packed float_data of a length not a multiple of 4".into());
                    }
                    view.float_data.push(run);
                }
                (7, 0) => view.encoded = r.varint()? != 0,
                _ => r.skip(wire)?,
            }
        }
        Ok(view)
    }

    /// The label alone: stops scanning at field 5 and skips field 4 without reading it.
    pub fn label_of(bytes: &[u8]) -> Result<i64, String> {
        let mut r = Reader { bytes, at: 0 };
        let mut label = 0;
        while !r.done() {
            let key = r.varint()?;
            match (key >> 3, key & 7) {
                (5, 0) => label = r.int32()?,
                (_, wire) => r.skip(wire)?,
            }
        }
        Ok(label)
    }

    /// The `float_data` values, in order.
    pub fn floats(&self) -> impl Iterator<Item = f32> + '_ {
        self.float_data.iter().flat_map(|run| {
            run.chunks_exact(4)
                .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        })
    }

    /// Number of `float_data` values.
    pub fn float_count(&self) -> usize {
        self.float_data.iter().map(|r| r.len() / 4).sum()
    }
}

/// A cursor over protobuf wire bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.bytes.get(self.at) else {
                return Err("truncated varint".into());
            };
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    /// An `int32` field: a varint whose low 32 bits are the two's-complement value.
    fn int32(&mut self) -> Result<i64, String> {
        Ok(i64::from(self.varint()? as u32 as i32))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.at.checked_add(n))
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "a field of {n} bytes runs past the record's end ({} bytes)",
                    self.bytes.len()
                )
            })?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn delimited(&mut self) -> Result<&'a [u8], String> {
        let n = self.varint()?;
        self.take(n)
    }

    fn fixed32(&mut self) -> Result<&'a [u8], String> {
        self.take(4)
    }

    fn skip(&mut self, wire: u64) -> Result<(), String> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.take(8).map(drop),
            2 => self.delimited().map(drop),
            5 => self.take(4).map(drop),
            w => Err(format!("wire type {w} is not a Datum field's")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_datum_reads_back() {
        let d = Datum {
            channels: Some(1),
            height: Some(2),
            width: Some(3),
            data: Some(vec![1, 2, 3, 4, 5, 6]),
            label: Some(7),
            float_data: vec![],
            encoded: Some(false),
        };
        let bytes = d.encode_to_vec();
        let v = DatumView::parse(&bytes).unwrap();
        assert_eq!((v.channels, v.height, v.width, v.label), (1, 2, 3, 7));
        assert_eq!(v.data, &[1, 2, 3, 4, 5, 6]);
        assert!(!v.encoded);
        assert_eq!(DatumView::label_of(&bytes), Ok(7));
        let f = Datum {
            float_data: vec![0.5, -2.0],
            label: Some(-1),
            ..Datum::default()
        };
        let bytes = f.encode_to_vec();
        let v = DatumView::parse(&bytes).unwrap();
        assert_eq!(v.floats().collect::<Vec<_>>(), vec![0.5, -2.0]);
        assert_eq!((v.float_count(), v.label), (2, -1));
    }

    #[test]
    fn truncated_and_garbage_bytes_are_errors() {
        let bytes = Datum {
            data: Some(vec![9; 100]),
            label: Some(3),
            ..Datum::default()
        }
        .encode_to_vec();
        for cut in 1..bytes.len() {
            // Every proper prefix either fails or lacks the label.
            match DatumView::parse(&bytes[..cut]) {
                Ok(v) => assert!(v.label == 0 || cut == bytes.len(), "cut {cut}"),
                Err(e) => assert!(!e.is_empty()),
            }
        }
        assert!(DatumView::parse(&[0x22, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        assert!(DatumView::parse(&[0x0b]).is_err()); // wire type 3
    }
}
