//! Caffe's mean image files (`mean.binaryproto`): a serialized `BlobProto` holding one image
//! `(C, H, W)` of per-pixel means, read for `data.mean_file` and written by
//! `p2ptrain compute-mean` (Caffe's `compute_image_mean`).
//!
//! The message is caffe.proto's `BlobProto`: the legacy dimensions `num` (1), `channels` (2),
//! `height` (3), `width` (4), or a `shape` (7, `BlobShape { repeated int64 dim = 1 }`); the values
//! in `data` (5, packed floats) or `double_data` (8, packed doubles). Files written here carry the
//! legacy dimensions with `num = 1` and packed `data`, as `compute_image_mean` writes them; both
//! dimension forms, packed or unpacked values, and floats or doubles are read. Other fields
//! (`diff`, `double_diff`) are skipped. `BlobProto` and `BlobShape` are shared with the
//! `.caffemodel` messages of `caffe::proto`.

use crate::error::{Error, Result};
use crate::input_file::{read_regular, UNBOUNDED};
use prost::Message;
use std::path::Path;

/// `BlobShape`: a blob's dimensions.
#[derive(Clone, PartialEq, Message)]
pub struct BlobShape {
    #[prost(int64, repeated, tag = "1")]
    pub dim: Vec<i64>,
}

/// `BlobProto`: a tensor, with either the legacy 4-D dimensions or a `shape`.
#[derive(Clone, PartialEq, Message)]
pub struct BlobProto {
    #[prost(int32, optional, tag = "1")]
    pub num: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub channels: Option<i32>,
    #[prost(int32, optional, tag = "3")]
    pub height: Option<i32>,
    #[prost(int32, optional, tag = "4")]
    pub width: Option<i32>,
    #[prost(float, repeated, tag = "5")]
    pub data: Vec<f32>,
    #[prost(message, optional, tag = "7")]
    pub shape: Option<BlobShape>,
    #[prost(double, repeated, tag = "8")]
    pub double_data: Vec<f64>,
}

impl BlobProto {
    /// The blob's dimensions: the legacy four when any is set, else `shape`'s.
    pub fn dims(&self) -> Vec<i64> {
        let legacy = [self.num, self.channels, self.height, self.width];
        if legacy.iter().any(Option::is_some) {
            legacy.iter().map(|d| i64::from(d.unwrap_or(0))).collect()
        } else {
            self.shape
                .as_ref()
                .map(|s| s.dim.clone())
                .unwrap_or_default()
        }
    }

    /// The values as f32: `data`, or `double_data` rounded.
    pub fn values(&self) -> Vec<f32> {
        if self.data.is_empty() {
            self.double_data.iter().map(|&v| v as f32).collect()
        } else {
            self.data.clone()
        }
    }

    /// A blob of `shape` (the modern form, as Caffe writes it) holding `data`.
    pub fn with_shape(shape: &[usize], data: &[f32]) -> Self {
        BlobProto {
            shape: Some(BlobShape {
                dim: shape.iter().map(|&d| d as i64).collect(),
            }),
            data: data.to_vec(),
            ..Default::default()
        }
    }
}

/// A mean image: `data (C·H·W)` in `(C, H, W)` order.
#[derive(Debug, Clone, PartialEq)]
pub struct MeanImage {
    pub shape: [usize; 3],
    pub data: Vec<f32>,
}

impl MeanImage {
    /// The image as a `BlobProto` with `num = 1` and the legacy dimensions.
    fn to_proto(&self) -> BlobProto {
        let [c, h, w] = self.shape.map(|d| d as i32);
        BlobProto {
            num: Some(1),
            channels: Some(c),
            height: Some(h),
            width: Some(w),
            data: self.data.clone(),
            ..Default::default()
        }
    }

    /// The image a serialized `BlobProto` holds; `Err` says what is wrong with it.
    fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, String> {
        let blob = BlobProto::decode(bytes)
            .map_err(|e| format!("not a Caffe BlobProto (binaryproto) file: {e}"))?;
        let dims = blob.dims();
        let shape = match dims[..] {
            [1, c, h, w] | [c, h, w] if c > 0 && h > 0 && w > 0 => {
                [c, h, w].map(|d| usize::try_from(d).unwrap_or(usize::MAX))
            }
            _ => {
                return Err(format!(
                    "a mean image has the shape (1, C, H, W) or (C, H, W) with C, H, W ≥ 1; this \
                     blob's is {dims:?}"
                ))
            }
        };
        let data = blob.values();
        let want = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if want != Some(data.len()) {
            return Err(format!(
                "the shape {}×{}×{} needs {} values, the blob holds {}",
                shape[0],
                shape[1],
                shape[2],
                want.map_or("too many".to_string(), |n| n.to_string()),
                data.len()
            ));
        }
        if let Some(i) = data.iter().position(|v| !v.is_finite()) {
            return Err(format!("value {i} is not finite ({})", data[i]));
        }
        Ok(MeanImage { shape, data })
    }
}

/// Reads the mean image at `path`; a missing, unreadable or malformed file is an
/// [`Error::Data`] naming it.
pub fn read(path: &Path) -> Result<MeanImage> {
    let bytes = read_regular(path, UNBOUNDED)
        .map_err(|e| Error::data(path, format!("cannot read: {e}")))?;
    parse(path, &bytes)
}

/// The mean image in the bytes of the file `path` (named in errors); never panics.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<MeanImage> {
    MeanImage::from_bytes(bytes).map_err(|msg| Error::data(path, msg))
}

/// Writes `image` to `path` atomically (a temporary file renamed over it: an interrupted write
/// leaves no partial file).
pub fn write(path: &Path, image: &MeanImage) -> Result<()> {
    let bytes = image.to_proto().encode_to_vec();
    crate::snapshot::write_atomic(path, "mean image", |tmp| std::fs::write(tmp, &bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protobuf varint.
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// Field `tag` of wire type `wire`.
    fn key(tag: u64, wire: u64, out: &mut Vec<u8>) {
        varint(tag << 3 | wire, out);
    }

    /// Field `tag` as a length-delimited `payload`.
    fn delimited(tag: u64, payload: &[u8], out: &mut Vec<u8>) {
        key(tag, 2, out);
        varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }

    fn image() -> MeanImage {
        MeanImage {
            shape: [2, 1, 3],
            data: vec![1.5, -2.0, 3.25, 125.3, 0.0, 7.0],
        }
    }

    /// The bytes of Caffe's `compute_image_mean` output for [`image`], encoded by hand from
    /// caffe.proto: num, channels, height, width as varints, then packed floats.
    fn caffe_legacy_bytes() -> Vec<u8> {
        let mut b = Vec::new();
        for (tag, v) in [(1, 1), (2, 2), (3, 1), (4, 3)] {
            key(tag, 0, &mut b);
            varint(v, &mut b);
        }
        let floats: Vec<u8> = image().data.iter().flat_map(|v| v.to_le_bytes()).collect();
        delimited(5, &floats, &mut b);
        b
    }

    #[test]
    fn reads_caffes_legacy_layout() {
        assert_eq!(MeanImage::from_bytes(&caffe_legacy_bytes()), Ok(image()));
    }

    #[test]
    fn writes_what_caffe_writes_and_reads_it_back() {
        assert_eq!(image().to_proto().encode_to_vec(), caffe_legacy_bytes());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mean.binaryproto");
        write(&path, &image()).unwrap();
        assert_eq!(read(&path).unwrap(), image());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
    }

    #[test]
    fn reads_a_shape_with_unpacked_doubles_and_skips_the_diff() {
        let mut b = Vec::new();
        let mut dims = Vec::new();
        for d in [2u64, 1, 3] {
            varint(d, &mut dims);
        }
        let mut shape = Vec::new();
        delimited(1, &dims, &mut shape);
        delimited(7, &shape, &mut b);
        delimited(6, &[0u8; 8], &mut b); // diff: two packed floats
        for v in image().data {
            key(8, 1, &mut b);
            b.extend_from_slice(&f64::from(v).to_le_bytes());
        }
        assert_eq!(MeanImage::from_bytes(&b), Ok(image()));
    }

    #[test]
    fn refuses_a_wrong_count_a_batch_of_images_garbage_and_non_finite_values() {
        let mut short = image();
        short.data.pop();
        let err = MeanImage::from_bytes(&short.to_proto().encode_to_vec()).unwrap_err();
        assert!(err.contains("needs 6 values, the blob holds 5"), "{err}");

        let mut batch = image().to_proto();
        batch.num = Some(2);
        let err = MeanImage::from_bytes(&batch.encode_to_vec()).unwrap_err();
        assert!(err.contains("[2, 2, 1, 3]"), "{err}");

        let err = MeanImage::from_bytes(b"\xff\xff\xff").unwrap_err();
        assert!(err.contains("not a Caffe BlobProto"), "{err}");

        let err = MeanImage::from_bytes(&[]).unwrap_err();
        assert!(err.contains("[]"), "an empty file has no shape: {err}");

        let mut nan = image();
        nan.data[4] = f32::NAN;
        let err = MeanImage::from_bytes(&nan.to_proto().encode_to_vec()).unwrap_err();
        assert!(err.contains("value 4 is not finite"), "{err}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let err = read(Path::new("/nonexistent/mean.binaryproto"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/nonexistent/mean.binaryproto: cannot read"),
            "{err}"
        );
    }
}
