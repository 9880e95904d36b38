//! One convolution through cuDNN's graph (backend) API, the interface through which cuDNN 9
//! offers its newer engines (PyTorch reaches cuDNN there): tensors described with their element
//! types one by one — so that a weight gradient may be FP32 from bfloat16 operands where an
//! engine takes it, which the legacy `cudnnConvolutionBackwardFilter` refuses — an operation
//! graph of the one convolution, the heuristics' engine configurations (mode A), and execution
//! plans of those that finalise.
//!
//! Tensors `x (N, C, H, W)`, `w (K, C, R, S)`, `y (N, K, P, Q)` are stored as a [`Layout`] says
//! (NCHW with a KCRS filter, or channels-last with a KRSC one), unique ids 1, 2 and 3; the
//! convolution computes in FP32 (cross-correlation), `y = α·conv + β·y` with α = 1 and β fixed
//! in the graph (0 or 1). A forward may add a bias `b (1, K, 1, 1)` of `y`'s type (unique id 4):
//! the convolution then writes a virtual FP32 tensor, and a pointwise addition in FP32 of `b`
//! writes `y` (β = 0), so that `y` is rounded once to its type from the FP32 sum, as a CPU layer
//! adds its bias before the one rounding of its top. (cuDNN 9 on an H200 offers no plan for an
//! NCHW bfloat16 forward with an FP32 bias, and plans for every layout with a bfloat16 one:
//! `survey::biased_half_type_forward_plans`.)
//!
//! Each [`Plan`] keeps what names its kernel — the engine's global index and its knob choices —
//! and its numerical notes ([`Notes`]), so that a caller keeps only the engines its math mode
//! and `conv_exact` allow, and builds the same engine again for the graph with the other β
//! ([`Plan::with_beta`]). The training convolutions (`crate::cuda::layers::convolution`) time
//! plans against the legacy API's algorithms and their own kernels, and run the chosen one on a
//! [`VariantPack`] built once per set of buffers ([`Packs`]); `survey` times the graph API on
//! ResNet-50's shapes in the half types, and one call's host time against the legacy API's.

use super::{check, ConvGeometry, Cudnn, WORKSPACE_LIMIT};
use crate::config::MathMode;
use crate::cuda::layout::Layout;
use crate::error::{Error, Result};
use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Attr, cudnnBackendAttributeType_t as Ty,
    cudnnBackendDescriptorType_t as Kind, cudnnDataType_t,
};
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::OnceLock;

/// The backend API's functions this module calls.
const SYMBOLS: &[&str] = &[
    "cudnnBackendCreateDescriptor",
    "cudnnBackendDestroyDescriptor",
    "cudnnBackendSetAttribute",
    "cudnnBackendGetAttribute",
    "cudnnBackendFinalize",
    "cudnnBackendExecute",
];

/// Whether the loaded cuDNN offers the graph API as this module describes it: version 9 or
/// later (the attributes and enums of its bindings) and every backend function called here.
/// Checked once; where it is not, the training convolutions keep the legacy calls.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        super::load_check().is_ok()
            && Cudnn::version() >= 90000
            && SYMBOLS.iter().all(|name| super::exports(name))
    })
}

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

    /// Sets attribute `name` to the one value `value` of type `ty`.
    ///
    /// # Safety
    /// `T` must be the C type that `ty` names.
    unsafe fn set_one<T>(&self, name: Attr, ty: Ty, value: T) -> Result<()> {
        // SAFETY: the caller's contract: one element of ty's C type.
        unsafe { self.set(name, ty, 1, (&value as *const T).cast()) }
    }

    fn set_data_type(&self, name: Attr, value: cudnnDataType_t) -> Result<()> {
        // SAFETY: a cudnnDataType_t.
        unsafe { self.set_one(name, Ty::CUDNN_TYPE_DATA_TYPE, value) }
    }

    fn set_f32(&self, name: Attr, value: f32) -> Result<()> {
        // SAFETY: a float.
        unsafe { self.set_one(name, Ty::CUDNN_TYPE_FLOAT, value) }
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
        // SAFETY: a live cudnnHandle_t.
        unsafe { self.set_one(name, Ty::CUDNN_TYPE_HANDLE, dnn.raw) }
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

/// One ungrouped convolution as the graph API describes it.
#[derive(Debug, Clone, Copy)]
pub struct Conv {
    pub direction: Direction,
    /// `x (N, C, H, W)`, `w (K, C, R, S)` and `y (N, K, P, Q)` (NCHW order whatever the layout).
    pub dims: [[usize; 4]; 3],
    pub types: Types,
    pub layout: Layout,
    /// Pads, strides and dilations; `group` must be 1.
    pub geometry: ConvGeometry,
    /// Forward only: `y = conv(x, w) + b`, with a bias `b (1, K, 1, 1)` of `y`'s type added in
    /// FP32 to the convolution's FP32 result before it is written in `y`'s type (β = 0).
    pub bias: bool,
}

/// What an engine trades for speed, from its numerical notes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Notes {
    /// Tensor cores on FP32 operands (TF32), inputs converted down, or a reduction in less
    /// than FP32.
    pub reduced_precision: bool,
    /// Results that may differ from run to run (atomics).
    pub nondeterministic: bool,
    /// An FFT or a Winograd transform, whose rounding is not a dot product's.
    pub transform: bool,
}

impl Notes {
    /// Whether an engine with these notes may run a convolution in `math`: only where the
    /// convolutions run on TF32 tensor cores (`tf32`, and `bf16` and `fp16`, whose operands
    /// TF32 holds exactly), any engine the legacy API's algorithms could be there
    /// (`super::allowed`), but with `exact` no nondeterministic one. Never in `fp32`: the notes
    /// do not mark every engine that rounds below FP32 (on an H200 with cuDNN 9, engine 17's
    /// weight gradient of a 5 × 5 convolution carries no note and was 1.7e-3 of its scale from
    /// the legacy FMA-math call, where FP32 dot products agree to 1e-6), so `fp32` keeps the
    /// legacy calls, whose math type rules TF32 out.
    pub fn allowed(&self, math: MathMode, exact: bool) -> bool {
        math.tf32_tensor_cores() && !(exact && self.nondeterministic)
    }
}

/// An execution plan of one engine configuration, with its workspace.
pub struct Plan {
    plan: Descriptor,
    /// Bytes of workspace the plan needs.
    pub workspace: usize,
    /// The engine's global index (for this operation graph).
    pub engine: i64,
    /// The configuration's knob choices, `(knob type, value)`.
    knobs: Vec<(i32, i64)>,
    pub notes: Notes,
    /// The engine's numerical notes as cuDNN's enum values (for the logs).
    note_codes: Vec<i32>,
}

// SAFETY: a backend descriptor is host memory owned by this value; it is used by one thread at
// a time (the replica's), as `Cudnn` is.
unsafe impl Send for Plan {}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("engine", &self.engine)
            .field("knobs", &self.knobs)
            .field("workspace", &self.workspace)
            .field("notes", &self.notes)
            .field("note_codes", &self.note_codes)
            .finish()
    }
}

/// A descriptor of `dims` (NCHW order) with element type `ty`, stored as `layout` says: a
/// tensor `(N, C, H, W)` or a filter `(K, C, R, S)` alike (KCRS beside NCHW, KRSC beside NHWC).
fn tensor(uid: i64, dims: [usize; 4], ty: cudnnDataType_t, layout: Layout) -> Result<Descriptor> {
    tensor_in(uid, dims, ty, layout, false)
}

/// [`tensor`], or with `virtual_` a tensor that lives only inside the graph (an operation's
/// result that the next one reads, never in memory).
fn tensor_in(
    uid: i64,
    dims: [usize; 4],
    ty: cudnnDataType_t,
    layout: Layout,
    virtual_: bool,
) -> Result<Descriptor> {
    let dims = dims.map(|d| d as i64);
    let [_, c, h, w] = dims;
    let strides = match layout {
        Layout::Nchw => [c * h * w, h * w, w, 1],
        Layout::Nhwc => [c * h * w, 1, w * c, c],
    };
    let t = Descriptor::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set_data_type(Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, ty)?;
    t.set_i64s(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims)?;
    t.set_i64s(Attr::CUDNN_ATTR_TENSOR_STRIDES, &strides)?;
    t.set_i64s(Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    t.set_i64s(Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16])?;
    if virtual_ {
        // SAFETY: a C `bool`.
        unsafe {
            t.set_one(
                Attr::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
                Ty::CUDNN_TYPE_BOOLEAN,
                true,
            )?
        };
    }
    t.finalize("tensor")?;
    Ok(t)
}

/// The unique ids of a plan's tensors in memory, in the order of its pointers: `x`, `w`, `y`
/// (their gradients by direction) and, for a forward with a bias, `b`.
const UNIQUE_IDS: [i64; 4] = [1, 2, 3, 4];

/// The unique id of the virtual FP32 result of a convolution whose bias is added after it.
const SUM_ID: i64 = 5;

/// The pointwise operation `y = sum + b` in FP32, `b (1, K, 1, 1)` broadcast over `sum`'s
/// samples and positions.
fn bias_addition(sum: &Descriptor, bias: &Descriptor, y: &Descriptor) -> Result<Descriptor> {
    use Attr::*;
    let add = Descriptor::new(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
    let mode = sys::cudnnPointwiseMode_t::CUDNN_POINTWISE_ADD;
    // SAFETY: a cudnnPointwiseMode_t.
    unsafe {
        add.set_one(
            CUDNN_ATTR_POINTWISE_MODE,
            Ty::CUDNN_TYPE_POINTWISE_MODE,
            mode,
        )?
    };
    add.set_data_type(
        CUDNN_ATTR_POINTWISE_MATH_PREC,
        cudnnDataType_t::CUDNN_DATA_FLOAT,
    )?;
    add.finalize("pointwise addition")?;
    let op = Descriptor::new(Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
    op.set_descriptors(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&add])?;
    op.set_descriptors(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[sum])?;
    op.set_descriptors(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[bias])?;
    op.set_descriptors(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[y])?;
    op.finalize("bias addition")?;
    Ok(op)
}

/// The operation graph of `conv` with `β = beta`.
fn operation_graph(dnn: &Cudnn, conv: &Conv, beta: f32) -> Result<Descriptor> {
    operation_graph_biased_in(dnn, conv, beta, conv.types[2])
}

/// [`operation_graph`] with a bias (where `conv` adds one) of element type `bias_type`.
fn operation_graph_biased_in(
    dnn: &Cudnn,
    conv: &Conv,
    beta: f32,
    bias_type: cudnnDataType_t,
) -> Result<Descriptor> {
    if conv.geometry.group != 1 {
        return Err(Error::Device(
            "cuDNN graph API: grouped convolutions are not described here".into(),
        ));
    }
    if conv.bias && (conv.direction != Direction::Forward || beta != 0.0) {
        return Err(Error::Device(
            "cuDNN graph API: a bias is added only to a forward convolution with β = 0".into(),
        ));
    }
    let x = tensor(1, conv.dims[0], conv.types[0], conv.layout)?;
    let w = tensor(2, conv.dims[1], conv.types[1], conv.layout)?;
    let y = tensor(3, conv.dims[2], conv.types[2], conv.layout)?;
    let float = cudnnDataType_t::CUDNN_DATA_FLOAT;
    // With a bias: the convolution's FP32 result, the bias, and their sum's operation into y.
    let biased = match conv.bias {
        true => {
            let sum = tensor_in(SUM_ID, conv.dims[2], float, conv.layout, true)?;
            let k = conv.dims[2][1];
            let bias = tensor(UNIQUE_IDS[3], [1, k, 1, 1], bias_type, conv.layout)?;
            let add = bias_addition(&sum, &bias, &y)?;
            Some((sum, add))
        }
        false => None,
    };
    let desc = Descriptor::new(Kind::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    desc.set_data_type(
        Attr::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        cudnnDataType_t::CUDNN_DATA_FLOAT,
    )?;
    let mode = sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
    let (attr, ty) = (
        Attr::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        Ty::CUDNN_TYPE_CONVOLUTION_MODE,
    );
    // SAFETY: a cudnnConvolutionMode_t.
    unsafe { desc.set_one(attr, ty, mode)? };
    let geometry = conv.geometry;
    let pair = |v: [usize; 2]| [v[0] as i64, v[1] as i64];
    desc.set_i64s(Attr::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
    desc.set_i64s(
        Attr::CUDNN_ATTR_CONVOLUTION_DILATIONS,
        &pair(geometry.dilation),
    )?;
    desc.set_i64s(
        Attr::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
        &pair(geometry.stride),
    )?;
    desc.set_i64s(
        Attr::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
        &pair(geometry.pad),
    )?;
    desc.set_i64s(
        Attr::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
        &pair(geometry.pad),
    )?;
    desc.finalize("convolution")?;
    use Attr::*;
    let (kind, names) = match conv.direction {
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
    op.set_descriptors(names[2], &[biased.as_ref().map_or(&y, |(sum, _)| sum)])?;
    op.set_descriptors(names[3], &[&desc])?;
    op.set_f32(names[4], 1.0)?;
    op.set_f32(names[5], beta)?;
    op.finalize("convolution operation")?;
    let mut ops = vec![&op];
    ops.extend(biased.as_ref().map(|(_, add)| add));
    let graph = Descriptor::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set_descriptors(CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops)?;
    graph.set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, dnn)?;
    graph.finalize("operation graph")?;
    Ok(graph)
}

/// The descriptors of kind `kind` that the descriptor array attribute `name` of `from` holds:
/// at most `capacity` of them, or as many as a count query answers where `capacity` is `None`
/// (the heuristics' results; an engine configuration answers 0 to that query for its knob
/// choices, so those are read into a fixed capacity).
fn descriptors_of(
    from: &Descriptor,
    name: Attr,
    kind: Kind,
    capacity: Option<i64>,
) -> Result<Vec<Descriptor>> {
    let count = match capacity {
        Some(capacity) => capacity,
        // SAFETY: a count query (no elements requested).
        None => unsafe {
            from.get(
                name,
                Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                std::ptr::null_mut(),
            )?
        },
    };
    let out = (0..count.max(0))
        .map(|_| Descriptor::new(kind))
        .collect::<Result<Vec<_>>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = out.iter().map(|d| d.0).collect();
    // SAFETY: `raw` holds `count` created descriptors of the attribute's kind for cuDNN to fill.
    let got = unsafe {
        from.get(
            name,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count,
            raw.as_mut_ptr().cast(),
        )?
    };
    Ok(out.into_iter().take(got.max(0) as usize).collect())
}

/// More knob choices than an engine configuration holds (cuDNN 9 has 44 knob types).
const KNOB_CAPACITY: i64 = 64;

/// One `i64` attribute of `d`.
fn get_i64(d: &Descriptor, name: Attr) -> Result<i64> {
    let mut v = 0i64;
    // SAFETY: one i64 requested into `v`.
    unsafe { d.get(name, Ty::CUDNN_TYPE_INT64, 1, (&mut v as *mut i64).cast())? };
    Ok(v)
}

/// What names the kernel of an engine configuration, and what it trades for speed.
struct Engine {
    /// The engine's global index.
    index: i64,
    /// The configuration's knob choices, `(knob type, value)`.
    knobs: Vec<(i32, i64)>,
    notes: Notes,
    /// The engine's numerical notes as cuDNN's enum values.
    note_codes: Vec<i32>,
}

/// The engine of the engine configuration `config`: its global index and notes, and the
/// configuration's knob choices.
fn describe(config: &Descriptor) -> Result<Engine> {
    let engines = descriptors_of(
        config,
        Attr::CUDNN_ATTR_ENGINECFG_ENGINE,
        Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR,
        Some(1),
    )?;
    let engine = engines
        .first()
        .ok_or_else(|| Error::Device("cuDNN graph API: a configuration without engine".into()))?;
    let index = get_i64(engine, Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
    // Read as the C enum's integers: an engine may carry a note newer than these bindings.
    let mut raw = [0i32; 32];
    // SAFETY: room for 32 enum values.
    let count = unsafe {
        engine.get(
            Attr::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
            Ty::CUDNN_TYPE_NUMERICAL_NOTE,
            raw.len() as i64,
            raw.as_mut_ptr().cast(),
        )?
    };
    use sys::cudnnBackendNumericalNote_t as N;
    let codes = raw[..(count.max(0) as usize).min(raw.len())].to_vec();
    let has = |note: N| codes.contains(&(note as i32));
    let notes = Notes {
        reduced_precision: has(N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
            || has(N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
            || has(N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION),
        nondeterministic: has(N::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC),
        transform: has(N::CUDNN_NUMERICAL_NOTE_FFT)
            || has(N::CUDNN_NUMERICAL_NOTE_WINOGRAD)
            || has(N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4)
            || has(N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6)
            || has(N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13),
    };
    let choices = descriptors_of(
        config,
        Attr::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
        Kind::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
        Some(KNOB_CAPACITY),
    )?;
    let knobs = choices
        .iter()
        .map(|choice| {
            let mut knob = 0i32;
            // SAFETY: one knob type, read as the C enum's integer.
            unsafe {
                choice.get(
                    Attr::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                    Ty::CUDNN_TYPE_KNOB_TYPE,
                    1,
                    (&mut knob as *mut i32).cast(),
                )?;
            }
            Ok((
                knob,
                get_i64(choice, Attr::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Engine {
        index,
        knobs,
        notes,
        note_codes: codes,
    })
}

/// The execution plan of the finalised engine configuration `config`, or `None` where `accept`
/// refuses the engine's notes (judged before the plan is built), or the engine cannot run its
/// graph here or asks for more than [`WORKSPACE_LIMIT`].
fn plan_of(
    dnn: &Cudnn,
    config: &Descriptor,
    accept: impl Fn(&Notes) -> bool,
) -> Result<Option<Plan>> {
    let engine = describe(config)?;
    if !accept(&engine.notes) {
        return Ok(None);
    }
    let plan = Descriptor::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set_handle(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, dnn)?;
    plan.set_descriptors(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
    if plan.finalize("execution plan").is_err() {
        return Ok(None); // an engine that cannot run this graph here
    }
    let workspace = get_i64(&plan, Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?.max(0) as usize;
    if workspace > WORKSPACE_LIMIT {
        return Ok(None);
    }
    Ok(Some(Plan {
        plan,
        workspace,
        engine: engine.index,
        knobs: engine.knobs,
        notes: engine.notes,
        note_codes: engine.note_codes,
    }))
}

/// The execution plans, in the heuristics' order (mode A), of `conv` with `β = beta`: at most
/// `max` of them, among the engines `accept` takes, skipping configurations that do not
/// finalise or want more than [`WORKSPACE_LIMIT`] of workspace. An error when the graph itself
/// is refused or no plan is left.
pub fn plans(
    dnn: &Cudnn,
    conv: &Conv,
    beta: f32,
    max: usize,
    accept: impl Fn(&Notes) -> bool,
) -> Result<Vec<Plan>> {
    let graph = operation_graph(dnn, conv, beta)?;
    let configs = configurations(&graph, sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A)?;
    let mut plans = Vec::new();
    for config in &configs {
        if plans.len() >= max {
            break;
        }
        if let Some(plan) = plan_of(dnn, config, &accept)? {
            plans.push(plan);
        }
    }
    if plans.is_empty() {
        let (direction, types) = (conv.direction, conv.types);
        let with = if conv.bias { " with its bias" } else { "" };
        return Err(Error::Device(format!(
            "cuDNN graph API: none of {} engine configurations runs the {direction:?} \
             convolution of {types:?}{with} as allowed",
            configs.len()
        )));
    }
    Ok(plans)
}

/// The engine configurations the heuristics of `mode` offer for `graph`, best first.
fn configurations(
    graph: &Descriptor,
    mode: sys::cudnnBackendHeurMode_t,
) -> Result<Vec<Descriptor>> {
    use Attr::*;
    let heur = Descriptor::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_descriptors(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?;
    // SAFETY: a cudnnBackendHeurMode_t.
    unsafe { heur.set_one(CUDNN_ATTR_ENGINEHEUR_MODE, Ty::CUDNN_TYPE_HEUR_MODE, mode)? };
    heur.finalize("engine heuristics")?;
    descriptors_of(
        &heur,
        CUDNN_ATTR_ENGINEHEUR_RESULTS,
        Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
        None,
    )
}

/// What cuDNN offers for the forward `conv` with its bias (`survey`): per bias element type
/// (FP32, and `y`'s, which [`operation_graph`] takes) and heuristics mode (A, B, fallback),
/// whether the graph finalises, how many configurations the heuristics give, and the engines
/// whose plans finalise here.
#[cfg(test)]
pub(super) fn biased_forward_offers(dnn: &Cudnn, conv: &Conv) -> Vec<String> {
    use sys::cudnnBackendHeurMode_t as Mode;
    let mut lines = Vec::new();
    for bias_type in [cudnnDataType_t::CUDNN_DATA_FLOAT, conv.types[2]] {
        let graph = match operation_graph_biased_in(dnn, conv, 0.0, bias_type) {
            Ok(graph) => graph,
            Err(e) => {
                lines.push(format!("bias {bias_type:?}: graph refused: {e}"));
                continue;
            }
        };
        for mode in [
            Mode::CUDNN_HEUR_MODE_A,
            Mode::CUDNN_HEUR_MODE_B,
            Mode::CUDNN_HEUR_MODE_FALLBACK,
        ] {
            let line = match configurations(&graph, mode) {
                Err(e) => format!("heuristics refused: {e}"),
                Ok(configs) => {
                    let engines: Vec<String> = configs
                        .iter()
                        .map(|c| match plan_of(dnn, c, |_| true) {
                            Ok(Some(p)) => format!("{} ({:?})", p.engine, p.notes),
                            Ok(None) => "-".into(),
                            Err(e) => format!("error {e}"),
                        })
                        .collect();
                    format!("{} configurations, plans {engines:?}", configs.len())
                }
            };
            lines.push(format!("bias {bias_type:?}, {mode:?}: {line}"));
        }
    }
    lines
}

impl Plan {
    /// The configuration's knob choices, `(knob type, value)`.
    pub fn knobs(&self) -> &[(i32, i64)] {
        &self.knobs
    }

    /// The same engine with the same knob choices for `conv` with `β = beta` (a plan timed
    /// with β = 0, built for a gradient the net accumulates), or `None` where it does not
    /// finalise for that graph.
    pub fn with_beta(&self, dnn: &Cudnn, conv: &Conv, beta: f32) -> Result<Option<Plan>> {
        use Attr::*;
        let graph = operation_graph(dnn, conv, beta)?;
        let engine = Descriptor::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
        engine.set_descriptors(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, &[&graph])?;
        engine.set_i64s(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, &[self.engine])?;
        if engine.finalize("engine").is_err() {
            return Ok(None);
        }
        let choices = self
            .knobs
            .iter()
            .map(|&(knob, value)| {
                let choice = Descriptor::new(Kind::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)?;
                let (attr, ty) = (CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, Ty::CUDNN_TYPE_KNOB_TYPE);
                // SAFETY: a knob type, as the C enum's integer cuDNN gave.
                unsafe { choice.set_one(attr, ty, knob)? };
                choice.set_i64s(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, &[value])?;
                choice.finalize("knob choice")?;
                Ok(choice)
            })
            .collect::<Result<Vec<_>>>()?;
        let config = Descriptor::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)?;
        config.set_descriptors(CUDNN_ATTR_ENGINECFG_ENGINE, &[&engine])?;
        if !choices.is_empty() {
            let refs: Vec<&Descriptor> = choices.iter().collect();
            config.set_descriptors(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, &refs)?;
        }
        if config.finalize("engine configuration").is_err() {
            return Ok(None);
        }
        plan_of(dnn, &config, |_| true)
    }
}

/// The device addresses one run of a plan reads and writes: `x`, `w` and `y` (their gradients
/// by direction, in the order of [`plans`]' dims), the bias `b` of a forward that adds one, and
/// the workspace. Built once, it serves every run on the same buffers ([`execute_pack`]), which
/// spares each run the pack's set-up.
pub struct VariantPack(Descriptor);

// SAFETY: as for `Plan`.
unsafe impl Send for VariantPack {}

impl VariantPack {
    /// The pack of `pointers` (`x`, `w`, `y`, and `b` where the plan adds a bias) and
    /// `workspace`.
    pub fn new(pointers: &[u64], workspace: u64) -> Result<VariantPack> {
        assert!(
            (3..=UNIQUE_IDS.len()).contains(&pointers.len()),
            "a variant pack of 3 or 4 tensors"
        );
        let pack = Descriptor::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        let ids = &UNIQUE_IDS[..pointers.len()];
        pack.set_i64s(Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, ids)?;
        let ptrs: Vec<*mut c_void> = pointers.iter().map(|&p| p as *mut c_void).collect();
        let ws = workspace as *mut c_void;
        // SAFETY: one device pointer per unique id, then one (stored, not dereferenced, by cuDNN
        // here).
        unsafe {
            pack.set(
                Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                Ty::CUDNN_TYPE_VOID_PTR,
                ptrs.len(),
                ptrs.as_ptr().cast(),
            )?;
            pack.set_one(
                Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                Ty::CUDNN_TYPE_VOID_PTR,
                ws,
            )?;
        }
        pack.finalize("variant pack")?;
        Ok(VariantPack(pack))
    }
}

/// How many variant packs [`Packs`] keeps.
const PACKS: usize = 8;

/// The variant packs of one plan, by the addresses they hold: built as new sets of buffers come
/// (a net's input blob alternates between staging buffers), at most [`PACKS`], the oldest
/// replaced first. A pack holds addresses only, so one whose buffers were freed is harmless,
/// and serves again where new buffers take the same addresses.
#[derive(Default)]
pub struct Packs(RefCell<Vec<(PackKey, VariantPack)>>);

/// A pack's tensor addresses (absent ones 0) and workspace.
type PackKey = [u64; 5];

impl std::fmt::Debug for Packs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packs({})", self.0.borrow().len())
    }
}

impl Packs {
    /// Runs `plan` on `dnn`'s stream with the device addresses `pointers` (as [`execute`]) and
    /// `workspace`, through the pack of those addresses (built on their first run).
    ///
    /// # Safety
    /// As [`execute`].
    pub unsafe fn execute(
        &self,
        dnn: &Cudnn,
        plan: &Plan,
        pointers: &[u64],
        workspace: u64,
    ) -> Result<()> {
        let mut key: PackKey = [0; 5];
        key[..pointers.len()].copy_from_slice(pointers);
        key[4] = workspace;
        let mut packs = self.0.borrow_mut();
        let at = match packs.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                if packs.len() == PACKS {
                    packs.remove(0);
                }
                packs.push((key, VariantPack::new(pointers, workspace)?));
                packs.len() - 1
            }
        };
        // SAFETY: the caller's contract.
        unsafe { execute_pack(dnn, plan, &packs[at].1) }
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
/// by direction, in the order of [`plans`]' dims; then `b` where the plan adds a bias) and
/// `workspace` (at least `plan.workspace` bytes), through a pack built for this run.
///
/// # Safety
/// The addresses must hold tensors of the plan's dims and types, and `workspace` enough bytes,
/// all alive until the stream has run the call.
pub unsafe fn execute(dnn: &Cudnn, plan: &Plan, pointers: &[u64], workspace: u64) -> Result<()> {
    let pack = VariantPack::new(pointers, workspace)?;
    // SAFETY: the caller's contract.
    unsafe { execute_pack(dnn, plan, &pack) }
}

#[cfg(test)]
mod tests {
    use super::Notes;
    use crate::config::MathMode;

    /// fp32 takes no engine; the TF32 modes (tf32, and bf16 and fp16, whose convolutions run
    /// on TF32 tensor cores) take every engine but, with `conv_exact`, nondeterministic ones.
    #[test]
    fn notes_allow_what_the_math_mode_and_conv_exact_allow() {
        let plain = Notes::default();
        let tf32 = Notes {
            reduced_precision: true,
            ..plain
        };
        let atomics = Notes {
            nondeterministic: true,
            ..plain
        };
        let winograd = Notes {
            transform: true,
            ..plain
        };
        for exact in [true, false] {
            for notes in [plain, tf32, atomics, winograd] {
                assert!(!notes.allowed(MathMode::Fp32, exact), "{notes:?}");
            }
            for math in [MathMode::Tf32, MathMode::Bf16, MathMode::Fp16] {
                assert!(plain.allowed(math, exact));
                assert!(tf32.allowed(math, exact));
                assert!(winograd.allowed(math, exact));
                assert_eq!(atomics.allowed(math, exact), !exact, "{math:?}");
            }
        }
    }
}
