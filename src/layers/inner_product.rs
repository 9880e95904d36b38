//! TODO stub
use crate::config::LayerConfig;
use crate::layers::{Ctx, Layer};
use crate::tensor::Blob;
use crate::error::Result;
pub struct InnerProduct;
impl InnerProduct { pub fn new(_c: &LayerConfig) -> Result<Self> { Ok(InnerProduct) } }
impl Layer for InnerProduct {
    fn type_name(&self) -> &'static str { "stub" }
    fn reshape(&mut self, b: &[&[usize]]) -> Result<Vec<Vec<usize>>> { Ok(vec![b[0].to_vec()]) }
    fn forward(&mut self, _: &Ctx, _: &[Blob], _: &[&[f32]], _: &mut [Blob]) { todo!() }
    fn backward(&mut self, _: &Ctx, _: &[Blob], _: &[bool], _: &mut [Blob], _: &[&[f32]], _: &mut [&mut [f32]]) { todo!() }
}
