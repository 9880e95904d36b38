//! One convolution through cuDNN's graph (backend) API, the interface through which cuDNN 9
//! offers its newer engines (PyTorch reaches cuDNN there): tensors described with their element
//! types one by one — so that a weight gradient may be FP32 from bfloat16 operands where an
//! engine takes it, which the legacy `cudnnConvolutionBackwardFilter` refuses — an operation
//! graph of the one convolution, the heuristics' engine configurations (mode A), and execution
//! plans of those that finalise.
//!
//! Tensors are channels-last: `x (N, C, H, W)`, `w (K, C, R, S)`, `y (N, K, P, Q)` with NHWC
//! strides, unique ids 1, 2 and 3; the convolution computes in FP32 (cross-correlation).
//!
//! The training layers still use the legacy API (`super`); this module is what
//! `survey::resnet50_graph_api_convolutions` times, the first step of half-type storage
//! (docs/design.md, Mixed precision, step 2), and what `survey::host_time_of_a_convolution_call`
//! sets against the legacy API's host time: a plan run on a [`VariantPack`] built once costs the
//! host a fraction of a legacy call.

use super::{check, ConvGeometry, Cudnn};
use crate::error::{Error, Result};
use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Attr, cudnnBackendAttributeType_t as Ty,
    cudnnBackendDescriptorType_t as Kind, cudnnDataType_t,
};
use std::ffi::c_void;

/// One backend descriptor, destroyed on drop.
struct Descriptor(sys::cudnnBackendDescriptor_t);

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: created by cudnnBackendCreateDescriptor and destroyed once.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Descriptor {
    fn new(kind: Kind) -> Result<Descriptor> {
        let mut raw: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `raw` is writable.
        check("cudnnBackendCreateDescriptor", unsafe {
            sys::cudnnBackendCreateDescriptor(kind, &mut raw)
        })?;
        Ok(Descriptor(raw))
    }

    /// Sets attribute `name` to the `count` elements of type `ty` at `values`.
    ///
    /// # Safety
    /// `values` must point to `count` elements of the C type that `ty` names.
    unsafe fn set(&self, name: Attr, ty: Ty, count: usize, values: *const c_void) -> Result<()> {
        // SAFETY: the caller's contract; the descriptor is live.
        check(&format!("cudnnBackendSetAttribute({name:?})"), unsafe {
            sys::cudnnBackendSetAttribute(self.0, name, ty, count as i64, values)
        })
    }

    /// Reads at most `requested` elements of type `ty` of attribute `name` into `out` (nothing
    /// when `requested` is 0); returns how many the attribute holds.
    ///
    /// # Safety
    /// `out` must have room for `requested` elements of the C type that `ty` names.
    unsafe fn get(&self, name: Attr, ty: Ty, requested: i64, out: *mut c_void) -> Result<i64> {
        let mut count = 0i64;
        // SAFETY: the caller's contract; the descriptor is live.
        check(&format!("cudnnBackendGetAttribute({name:?})"), unsafe {
            sys::cudnnBackendGetAttribute(self.0, name, ty, requested, &mut count, out)
        })?;
        Ok(count)
    }

    fn set_i64s(&self, name: Attr, values: &[i64]) -> Result<()> {
        // SAFETY: `values` holds `len` i64s.
        unsafe {
            self.set(
                name,
                Ty::CUDNN_TYPE_INT64,
                values.len(),
                values.as_ptr().cast(),
            )
        }
    }

    fn set_data_type(&self, name: Attr, value: cudnnDataType_t) -> Result<()> {
        // SAFETY: one cudnnDataType_t.
        unsafe {
            self.set(
                name,
                Ty::CUDNN_TYPE_DATA_TYPE,
                1,
                (&value as *const cudnnDataType_t).cast(),
            )
        }
    }

    fn set_f32(&self, name: Attr, value: f32) -> Result<()> {
        // SAFETY: one float.
        unsafe { self.set(name, Ty::CUDNN_TYPE_FLOAT, 1, (&value as *const f32).cast()) }
    }

    fn set_descriptors(&self, name: Attr, values: &[&Descriptor]) -> Result<()> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = values.iter().map(|d| d.0).collect();
        // SAFETY: `raw` holds `len` live descriptors.
        unsafe {
            self.set(
                name,
                Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                raw.len(),
                raw.as_ptr().cast(),
            )
        }
    }

    fn set_handle(&self, name: Attr, dnn: &Cudnn) -> Result<()> {
        let handle = dnn.raw;
        // SAFETY: one live cudnnHandle_t.
        unsafe {
            self.set(
                name,
                Ty::CUDNN_TYPE_HANDLE,
                1,
                (&handle as *const sys::cudnnHandle_t).cast(),
            )
        }
    }

    fn finalize(&self, what: &str) -> Result<()> {
        // SAFETY: live descriptor.
        check(&format!("cudnnBackendFinalize({what})"), unsafe {
            sys::cudnnBackendFinalize(self.0)
        })
    }
}

/// Which convolution of a layer: `y = conv(x, w)`, `dx = conv_t(dy, w)` or `dw = conv(x, dy)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Forward,
    BackwardData,
    BackwardFilter,
}

/// The element types of `x`, `w` and `y` (or of their gradients, by direction).
pub type Types = [cudnnDataType_t; 3];

/// An execution plan of one engine configuration, with its workspace.
pub struct Plan {
    plan: Descriptor,
    /// Bytes of workspace the plan needs.
    pub workspace: usize,
}

/// A channels-last tensor descriptor of `dims` (NCHW order) and element type `ty`.
fn tensor(uid: i64, dims: [usize; 4], ty: cudnnDataType_t) -> Result<Descriptor> {
    let [n, c, h, w] = dims.map(|d| d as i64);
    let t = Descriptor::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set_data_type(Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, ty)?;
    t.set_i64s(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, &[n, c, h, w])?;
    t.set_i64s(Attr::CUDNN_ATTR_TENSOR_STRIDES, &[c * h * w, 1, w * c, c])?;
    t.set_i64s(Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    t.set_i64s(Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16])?;
    t.finalize("tensor")?;
    Ok(t)
}

/// The execution plans, in the heuristics' order, of the convolution `direction` of `x`
/// (`(N, C, H, W)`), `w` (`(K, C, R, S)`) and `y` (`(N, K, P, Q)`) with `geometry` (no groups) and
/// element types `types`: at most `max` of them, skipping configurations that do not finalise.
/// An error when the graph itself is refused (no engine supports it at all).
pub fn plans(
    dnn: &Cudnn,
    direction: Direction,
    dims: [[usize; 4]; 3],
    types: Types,
    geometry: ConvGeometry,
    max: usize,
) -> Result<Vec<Plan>> {
    let x = tensor(1, dims[0], types[0])?;
    let w = tensor(2, dims[1], types[1])?;
    let y = tensor(3, dims[2], types[2])?;
    let conv = Descriptor::new(Kind::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    conv.set_data_type(
        Attr::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        cudnnDataType_t::CUDNN_DATA_FLOAT,
    )?;
    let mode = sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
    // SAFETY: one cudnnConvolutionMode_t.
    unsafe {
        conv.set(
            Attr::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            Ty::CUDNN_TYPE_CONVOLUTION_MODE,
            1,
            (&mode as *const sys::cudnnConvolutionMode_t).cast(),
        )?;
    }
    let pair = |v: [usize; 2]| [v[0] as i64, v[1] as i64];
    conv.set_i64s(Attr::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
    conv.set_i64s(
        Attr::CUDNN_ATTR_CONVOLUTION_DILATIONS,
        &pair(geometry.dilation),
    )?;
    conv.set_i64s(
        Attr::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
        &pair(geometry.stride),
    )?;
    conv.set_i64s(
        Attr::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
        &pair(geometry.pad),
    )?;
    conv.set_i64s(
        Attr::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
        &pair(geometry.pad),
    )?;
    conv.finalize("convolution")?;
    use Attr::*;
    let (kind, names) = match direction {
        Direction::Forward => (
            Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            [
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            ],
        ),
        Direction::BackwardData => (
            Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            [
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
            ],
        ),
        Direction::BackwardFilter => (
            Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            [
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
            ],
        ),
    };
    let op = Descriptor::new(kind)?;
    op.set_descriptors(names[0], &[&x])?;
    op.set_descriptors(names[1], &[&w])?;
    op.set_descriptors(names[2], &[&y])?;
    op.set_descriptors(names[3], &[&conv])?;
    op.set_f32(names[4], 1.0)?;
    op.set_f32(names[5], 0.0)?;
    op.finalize("convolution operation")?;
    let graph = Descriptor::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set_descriptors(CUDNN_ATTR_OPERATIONGRAPH_OPS, &[&op])?;
    graph.set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, dnn)?;
    graph.finalize("operation graph")?;
    let heur = Descriptor::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_descriptors(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph])?;
    let heur_mode = sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A;
    // SAFETY: one cudnnBackendHeurMode_t.
    unsafe {
        heur.set(
            CUDNN_ATTR_ENGINEHEUR_MODE,
            Ty::CUDNN_TYPE_HEUR_MODE,
            1,
            (&heur_mode as *const sys::cudnnBackendHeurMode_t).cast(),
        )?;
    }
    heur.finalize("engine heuristics")?;
    // SAFETY: a count query (no elements requested).
    let count = unsafe {
        heur.get(
            CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            std::ptr::null_mut(),
        )?
    };
    let configs = (0..count.max(0))
        .map(|_| Descriptor::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = configs.iter().map(|d| d.0).collect();
    // SAFETY: `raw` holds `count` created engine-configuration descriptors for cuDNN to fill.
    let got = unsafe {
        heur.get(
            CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count,
            raw.as_mut_ptr().cast(),
        )?
    };
    let mut plans = Vec::new();
    for config in configs.iter().take(got.max(0) as usize) {
        if plans.len() >= max {
            break;
        }
        let plan = Descriptor::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        plan.set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, dnn)?;
        plan.set_descriptors(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
        if plan.finalize("execution plan").is_err() {
            continue; // an engine that cannot run this graph here
        }
        let mut workspace = 0i64;
        // SAFETY: one i64 requested into `workspace`.
        unsafe {
            plan.get(
                CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                Ty::CUDNN_TYPE_INT64,
                1,
                (&mut workspace as *mut i64).cast(),
            )?;
        }
        plans.push(Plan {
            plan,
            workspace: workspace.max(0) as usize,
        });
    }
    if plans.is_empty() {
        return Err(Error::Device(format!(
            "cuDNN graph API: none of {got} engine configurations runs the {direction:?} \
             convolution of {types:?}"
        )));
    }
    Ok(plans)
}

/// The device addresses one run of a plan reads and writes: `x`, `w` and `y` (their gradients
/// by direction, in the order of [`plans`]' dims) and the workspace. Built once, it serves every
/// run on the same buffers ([`execute_pack`]), which spares each run the pack's set-up.
pub struct VariantPack(Descriptor);

impl VariantPack {
    /// The pack of `pointers` and `workspace`.
    pub fn new(pointers: [u64; 3], workspace: u64) -> Result<VariantPack> {
        let pack = Descriptor::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        pack.set_i64s(Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &[1, 2, 3])?;
        let ptrs: [*mut c_void; 3] = pointers.map(|p| p as *mut c_void);
        let ws = workspace as *mut c_void;
        // SAFETY: three device pointers, then one (stored, not dereferenced, by cuDNN here).
        unsafe {
            pack.set(
                Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                Ty::CUDNN_TYPE_VOID_PTR,
                3,
                ptrs.as_ptr().cast(),
            )?;
            pack.set(
                Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                Ty::CUDNN_TYPE_VOID_PTR,
                1,
                (&ws as *const *mut c_void).cast(),
            )?;
        }
        pack.finalize("variant pack")?;
        Ok(VariantPack(pack))
    }
}

/// Runs `plan` on `dnn`'s stream on the addresses of `pack`.
///
/// # Safety
/// The pack's addresses must hold tensors of the plan's dims and types, and its workspace
/// enough bytes, all alive until the stream has run the call.
pub unsafe fn execute_pack(dnn: &Cudnn, plan: &Plan, pack: &VariantPack) -> Result<()> {
    // SAFETY: live handle, plan and pack; the caller's contract on the addresses.
    check("cudnnBackendExecute", unsafe {
        sys::cudnnBackendExecute(dnn.raw, plan.plan.0, pack.0 .0)
    })
}

/// Runs `plan` on `dnn`'s stream with the device addresses of `x`, `w` and `y` (their gradients
/// by direction, in the order of [`plans`]' dims) and `workspace` (at least `plan.workspace`
/// bytes), through a pack built for this run.
///
/// # Safety
/// The addresses must hold tensors of the plan's dims and types, and `workspace` enough bytes,
/// all alive until the stream has run the call.
pub unsafe fn execute(dnn: &Cudnn, plan: &Plan, pointers: [u64; 3], workspace: u64) -> Result<()> {
    let pack = VariantPack::new(pointers, workspace)?;
    // SAFETY: the caller's contract.
    unsafe { execute_pack(dnn, plan, &pack) }
}
