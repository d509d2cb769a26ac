//! Tensors from safetensors files: what `XWeights::from_safetensors` and
//! `fusion run` read.
//!
//! A [`TensorFile`] is a whole file read and checked once (its header, and
//! that every tensor's bytes lie inside it); [`TensorNames`] says under which
//! name each of a graph's tensors is stored (its declared name by default,
//! with a prefix and renames, or a decoder layer's Hugging Face names); a
//! [`Binder`], which generated wrappers make, checks a graph's tensors in a
//! file (present, element type, shape against the declaration, dynamic dims
//! agreeing) before copying any of them to the device. Every refusal is a
//! [`fusion::Error`](crate::Error) that names the file, the name in it and
//! the graph's tensor.
//!
//! Not a general safetensors reader: only vectors and matrices of f16, bf16
//! and f32, the tensors kernels take.

use crate::error::{Error, Result};
use crate::launch::{Bound, GraphDecl, TensorDecl, bind_dims, declared_shape};
use crate::tensor::{Element, Shape, Tensor};
use cudarc::driver::CudaStream;
use fusion_compiler::ir::DType;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::io::Read;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// A safetensors file in memory, its header checked.
#[derive(Debug)]
pub struct TensorFile {
    /// The path it was read from (or a caller's label), for messages.
    label: String,
    bytes: Vec<u8>,
    tensors: BTreeMap<String, StoredTensor>,
}

/// Where one tensor's elements lie in [`TensorFile::bytes`].
#[derive(Clone, Debug)]
struct StoredTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Range<usize>,
}

/// One tensor of a [`TensorFile`].
#[derive(Clone, Copy, Debug)]
pub struct StoredView<'f> {
    /// Its element type as the file names it (`F16`, `BF16`, `I64`, …).
    pub dtype: Dtype,
    /// Its shape, outermost axis first.
    pub shape: &'f [usize],
    /// Its elements, little-endian, row-major.
    pub bytes: &'f [u8],
}

impl StoredView<'_> {
    /// The element type, where kernels have it.
    pub fn element_type(&self) -> Option<DType> {
        dtype_of(self.dtype)
    }
}

/// The kernels' element type for a file's, where they have one.
fn dtype_of(dtype: Dtype) -> Option<DType> {
    match dtype {
        Dtype::F16 => Some(DType::F16),
        Dtype::BF16 => Some(DType::BF16),
        Dtype::F32 => Some(DType::F32),
        _ => None,
    }
}

/// A file's name for an element type.
pub fn file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F8E4M3 => Dtype::F8_E4M3,
    }
}

/// The largest tensor file [`TensorFile::open`] reads, in bytes: the whole
/// file is held in host memory. Four times an unsharded checkpoint of an
/// 8B-parameter model in f16 (16 GB); Hugging Face checkpoints are sharded
/// into files smaller than that.
pub const MAX_TENSOR_FILE_BYTES: u64 = 64 << 30;

impl TensorFile {
    /// Reads and checks the file at `path`, of at most
    /// [`MAX_TENSOR_FILE_BYTES`] ([`Error::TensorFileTooLarge`]). It reads
    /// no further than the file's header says the file goes, so a file
    /// that never ends (`/dev/zero`) is refused once its header is read
    /// rather than read until memory runs out.
    pub fn open(path: impl AsRef<Path>) -> Result<TensorFile> {
        open_within(path.as_ref(), MAX_TENSOR_FILE_BYTES)
    }

    /// Checks the bytes of a safetensors file; `label` names it in messages.
    pub fn from_bytes(label: impl Into<String>, bytes: Vec<u8>) -> Result<TensorFile> {
        let label = label.into();
        let parsed = SafeTensors::deserialize(&bytes).map_err(|e| Error::TensorFile {
            file: label.clone(),
            reason: format!("not a safetensors file: {e}"),
        })?;
        let start = bytes.as_ptr() as usize;
        let tensors = parsed
            .iter()
            .map(|(name, view)| {
                // The reader hands out subslices of `bytes`.
                let offset = view.data().as_ptr() as usize - start;
                let stored = StoredTensor {
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    bytes: offset..offset + view.data().len(),
                };
                (name.to_owned(), stored)
            })
            .collect();
        Ok(TensorFile {
            label,
            bytes,
            tensors,
        })
    }

    /// The path or label it was read under.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The names of its tensors, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The tensor stored as `name`.
    pub fn get(&self, name: &str) -> Option<StoredView<'_>> {
        self.tensors.get(name).map(|t| StoredView {
            dtype: t.dtype,
            shape: &t.shape,
            bytes: &self.bytes[t.bytes.clone()],
        })
    }

    /// The error for a tensor the file lacks: how many it holds, a few of
    /// their names, and the name that differs from it only by a prefix.
    pub fn missing(&self, name: &str, tensor: &'static str) -> Error {
        let names: Vec<&str> = self.names().collect();
        let shown: Vec<String> = names.iter().take(4).map(|n| format!("`{n}`")).collect();
        let held = match names.len() {
            0 => "no tensors".to_owned(),
            n if n <= shown.len() => format!("{n}: {}", shown.join(", ")),
            n => format!("{n}, such as {}", shown.join(", ")),
        };
        let suffix = format!(".{name}");
        let hint = names
            .iter()
            .find(|n| n.ends_with(&suffix))
            .map(|n| format!("; `{n}` ends with it: give its prefix in the tensor names"))
            .unwrap_or_default();
        Error::MissingTensor {
            file: self.label.clone(),
            name: name.to_owned(),
            tensor,
            held,
            hint,
        }
    }
}

/// [`TensorFile::open`] with a limit of `limit` bytes.
fn open_within(path: &Path, limit: u64) -> Result<TensorFile> {
    let label = path.display().to_string();
    let cannot_read = |e: std::io::Error| Error::TensorFile {
        file: label.clone(),
        reason: format!("cannot read it: {e}"),
    };
    let file = std::fs::File::open(path).map_err(cannot_read)?;
    // A regular file says how long it is: one too long is refused unread.
    let stated = file.metadata().map_err(cannot_read)?;
    if stated.is_file() && stated.len() > limit {
        return Err(Error::TensorFileTooLarge {
            file: label,
            bytes: stated.len(),
            by: "its size",
            limit,
        });
    }
    let bytes = read_safetensors(&label, file, limit)?;
    TensorFile::from_bytes(label, bytes)
}

/// The bytes of a safetensors file from `reader`, read no further than its
/// header says the file goes (and one byte past that, so that a longer
/// file is refused as one): its 8-byte header length, the header, then its
/// tensors' bytes, which the header gives. A file whose header says it
/// holds more than `limit` bytes is refused before its tensors are read.
/// Bytes that do not make a header (a header longer than `limit`, or one
/// safetensors does not take) are returned as read, for
/// [`TensorFile::from_bytes`] to say why they are not safetensors.
fn read_safetensors(label: &str, mut reader: impl Read, limit: u64) -> Result<Vec<u8>> {
    let cannot_read = |e: std::io::Error| Error::TensorFile {
        file: label.to_owned(),
        reason: format!("cannot read it: {e}"),
    };
    let mut bytes = Vec::new();
    let mut read_up_to = |bytes: &mut Vec<u8>, end: u64| {
        let more = end.saturating_sub(bytes.len() as u64);
        (&mut reader).take(more).read_to_end(bytes).map_err(cannot_read)
    };
    read_up_to(&mut bytes, 8)?;
    let Ok(length) = <[u8; 8]>::try_from(bytes.as_slice()) else {
        return Ok(bytes);
    };
    // A header longer than the limit is far longer than safetensors takes
    // (100 MB): these are not safetensors bytes, which `from_bytes` says.
    let header_end = u64::from_le_bytes(length).saturating_add(8);
    if header_end > limit {
        return Ok(bytes);
    }
    read_up_to(&mut bytes, header_end)?;
    let Ok(header) = serde_json::from_slice::<safetensors::tensor::Metadata>(&bytes[8..]) else {
        return Ok(bytes);
    };
    let end = header_end.saturating_add(header.data_len() as u64);
    if end > limit {
        return Err(Error::TensorFileTooLarge {
            file: label.to_owned(),
            bytes: end,
            by: "as its header says",
            limit,
        });
    }
    read_up_to(&mut bytes, end.saturating_add(1))?;
    Ok(bytes)
}

/// The name under which each of a graph's tensors is stored in a file.
/// The default is each tensor's declared name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TensorNames {
    prefix: String,
    renames: Vec<(String, String)>,
}

impl TensorNames {
    /// Each tensor under its declared name.
    pub fn declared() -> TensorNames {
        TensorNames::default()
    }

    /// Each tensor under `prefix` followed by its (renamed) name, such as
    /// `model.layers.3.` for a decoder layer.
    pub fn with_prefix(prefix: impl Into<String>) -> TensorNames {
        TensorNames {
            prefix: prefix.into(),
            renames: Vec::new(),
        }
    }

    /// Decoder layer `layer` of a Llama-style Hugging Face checkpoint
    /// (Llama, Mistral, Qwen2, Qwen3): `w_gate` is
    /// `model.layers.<layer>.mlp.gate_proj.weight`, `w_up` and `w_down` the
    /// up and down projections, `norm` (or `gamma`) the layer's
    /// `post_attention_layernorm.weight`, as `fusion graph --from-hf` names
    /// them; other names are kept under the same prefix.
    pub fn hugging_face(layer: usize) -> TensorNames {
        let mut names = TensorNames::with_prefix(format!("model.layers.{layer}."));
        for (ours, theirs) in fusion_compiler::names::GATED_WEIGHT_NAMES {
            names = names.rename(*ours, *theirs);
        }
        names
    }

    /// Stores `declared` as `in_file` (after the prefix); a later rename of
    /// the same tensor replaces an earlier one.
    #[must_use]
    pub fn rename(mut self, declared: impl Into<String>, in_file: impl Into<String>) -> TensorNames {
        let declared = declared.into();
        self.renames.retain(|(d, _)| *d != declared);
        self.renames.push((declared, in_file.into()));
        self
    }

    /// The name in the file of the graph's tensor `declared`.
    pub fn in_file(&self, declared: &str) -> String {
        let name = self
            .renames
            .iter()
            .find(|(d, _)| d == declared)
            .map_or(declared, |(_, f)| f.as_str());
        format!("{}{name}", self.prefix)
    }
}

/// A graph struct's weights once bound ([`crate::plan::bind`]): what its
/// kernels read and nothing else. Each declared weight that some kernel
/// reads as given is kept (borrowed or owned, as it was given); one that
/// binding replaced with a prepared copy (a gated pair's gate and up
/// interleaved into one weight, a norm's gamma and beta folded into the
/// weight after it, which is replaced too, a weight's rows padded) is not:
/// an owned tensor is dropped once its copy exists, a borrowed one is no
/// longer referenced (the caller's memory is the caller's to free). The
/// device memory the struct holds is [`BoundWeights::prepared_bytes`] (the
/// copies) plus, for owned weights, [`BoundWeights::kept_bytes`].
#[derive(Debug)]
pub struct BoundWeights<'w, T> {
    pub(crate) graph: &'static str,
    /// Each weight's declared name, in the table's order.
    pub(crate) names: Vec<&'static str>,
    /// Each weight where a kernel reads it as given, else `None`.
    pub(crate) tensors: Vec<Option<Tensor<'w, T>>>,
    /// Each weight's shape as it was bound: a call's dims are read from
    /// them where the weight is no longer kept.
    pub(crate) shapes: Vec<Shape>,
    /// Per kernel, the copy binding prepared for it.
    pub(crate) prepared: Vec<Option<crate::launch::FoldedWeights>>,
    /// Per weight not kept, what became of it, for [`BoundWeights::get`].
    pub(crate) replaced: Vec<Option<String>>,
}

impl<'w, T: Element> BoundWeights<'w, T> {
    /// The declared weight `name` where the bound struct keeps it; where
    /// binding replaced it, [`Error::WeightNotKept`] saying with what (the
    /// kernel and the form its copy takes), as for a name the graph does
    /// not declare.
    pub fn get(&self, name: &str) -> Result<&Tensor<'w, T>> {
        let not_kept = |reason: String| Error::WeightNotKept {
            graph: self.graph.to_owned(),
            tensor: name.to_owned(),
            reason,
        };
        let Some(index) = self.names.iter().position(|&n| n == name) else {
            return Err(not_kept(format!(
                "it declares no such weight (its weights: {})",
                self.names.join(", ")
            )));
        };
        match (&self.tensors[index], &self.replaced[index]) {
            (Some(tensor), _) => Ok(tensor),
            (None, Some(reason)) => Err(not_kept(reason.clone())),
            (None, None) => Err(not_kept("no kernel reads it".to_owned())),
        }
    }

    /// The weights kept as given, by declared name, in declaration order.
    pub fn kept(&self) -> impl Iterator<Item = (&'static str, &Tensor<'w, T>)> {
        self.names
            .iter()
            .zip(&self.tensors)
            .filter_map(|(&name, tensor)| Some((name, tensor.as_ref()?)))
    }

    /// The declared shape of each weight as it was bound, kept or not.
    pub fn shape(&self, name: &str) -> Option<Shape> {
        let index = self.names.iter().position(|&n| n == name)?;
        Some(self.shapes[index])
    }

    /// Bytes of the weights kept as given (device memory the struct holds
    /// where they are owned, the caller's where they are borrowed).
    pub fn kept_bytes(&self) -> usize {
        self.kept()
            .map(|(_, tensor)| tensor.shape().bytes::<T>().unwrap_or(0))
            .sum()
    }

    /// Bytes of the copies binding made, which the struct owns: each the
    /// size of the weights it replaced, plus any row padding, plus 8 bytes
    /// per output column of a folded norm's terms.
    pub fn prepared_bytes(&self) -> usize {
        self.prepared.iter().flatten().map(|p| p.bytes()).sum()
    }

    /// Bytes the kernels read from weights on every call:
    /// [`BoundWeights::kept_bytes`] plus [`BoundWeights::prepared_bytes`].
    pub fn bytes(&self) -> usize {
        self.kept_bytes() + self.prepared_bytes()
    }

    /// Per kernel of the plan, the copy binding prepared for it: for
    /// `fusion run`, which tells the reference which norms were folded.
    #[doc(hidden)]
    pub fn prepared(&self) -> &[Option<crate::launch::FoldedWeights>] {
        &self.prepared
    }
}

/// Checks a graph's tensors in one file and copies them to the device: what
/// a generated `XWeights::from_safetensors` runs.
pub struct Binder<'f> {
    graph: &'static GraphDecl,
    file: &'f TensorFile,
    names: &'f TensorNames,
    /// Each dynamic dim's value and the tensor it was read from.
    dims: Vec<Option<Bound>>,
}

impl<'f> Binder<'f> {
    /// A binder for `graph`'s tensors in `file`, looked up under `names`.
    pub fn new(graph: &'static GraphDecl, file: &'f TensorFile, names: &'f TensorNames) -> Binder<'f> {
        Binder {
            graph,
            file,
            names,
            dims: vec![None; graph.dims.len()],
        }
    }

    /// Checks each tensor: present, of element type `T`, shaped as
    /// declared, its dynamic dims agreeing with the tensors before it.
    /// Nothing touches the device. Returns their shapes.
    pub fn check<T: Element>(&mut self, decls: &[&'static TensorDecl]) -> Result<Vec<Shape>> {
        decls.iter().map(|decl| Ok(self.checked::<T>(decl)?.1)).collect()
    }

    /// The checked tensor `decl` as a device tensor on `stream` that owns
    /// its memory.
    pub fn upload<T: Element>(
        &mut self,
        stream: &Arc<CudaStream>,
        decl: &'static TensorDecl,
    ) -> Result<Tensor<'static, T>> {
        let (view, shape) = self.checked::<T>(decl)?;
        let slice = stream.clone_htod(&T::from_le_bytes(view.bytes))?;
        Tensor::owned(slice, shape)
    }

    /// Rows `rows` of the checked matrix `decl`, in host memory: for a
    /// binding that copies a large weight to the device a part at a time.
    pub fn rows<T: Element>(&self, decl: &'static TensorDecl, rows: Range<usize>) -> Result<Vec<T>> {
        let name = self.names.in_file(decl.name);
        let file = self.file;
        let view = file.get(&name).ok_or_else(|| file.missing(&name, decl.name))?;
        let row_bytes = view.shape.last().copied().unwrap_or(1) * size_of::<T>();
        let bytes = view
            .bytes
            .get(rows.start * row_bytes..rows.end * row_bytes)
            .ok_or_else(|| Error::TensorShape {
                file: file.label.clone(),
                name: name.clone(),
                tensor: decl.name,
                expected: format!("at least {} rows", rows.end),
                actual: format!("{:?}", view.shape),
            })?;
        Ok(T::from_le_bytes(bytes))
    }

    fn checked<T: Element>(&mut self, decl: &'static TensorDecl) -> Result<(StoredView<'f>, Shape)> {
        let name = self.names.in_file(decl.name);
        let file = self.file;
        let view = file.get(&name).ok_or_else(|| file.missing(&name, decl.name))?;
        if view.element_type() != Some(T::DTYPE) {
            return Err(Error::TensorDType {
                file: file.label.clone(),
                name,
                tensor: decl.name,
                expected: T::DTYPE.to_string(),
                actual: view.dtype.to_string(),
            });
        }
        let shape_error = || Error::TensorShape {
            file: file.label.clone(),
            name: name.clone(),
            tensor: decl.name,
            expected: declared_shape(self.graph, decl),
            actual: format!("{:?}", view.shape),
        };
        let shape = match *view.shape {
            [n] if decl.shape.len() == 1 => Shape::Vector(n),
            [r, c] if decl.shape.len() == 2 => Shape::Matrix(r, c),
            _ => return Err(shape_error()),
        };
        if !bind_dims(self.graph, &mut self.dims, decl, view.shape)? {
            return Err(shape_error());
        }
        Ok((view, shape))
    }
}

/// A safetensors file holding `tensors` (name, element type, shape,
/// little-endian bytes), in name order.
pub fn serialize(tensors: &[(String, DType, Vec<usize>, Vec<u8>)]) -> Result<Vec<u8>, String> {
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            safetensors::tensor::TensorView::new(file_dtype(*dtype), shape.clone(), bytes)
                .map(|view| (name.as_str(), view))
                .map_err(|e| format!("tensor `{name}`: {e}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    safetensors::serialize(views, None).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::Dim;
    use half::f16;

    static GRAPH: GraphDecl = GraphDecl {
        name: "ffn",
        dims: &["M"],
    };
    static W_GATE: TensorDecl = TensorDecl {
        name: "w_gate",
        shape: &[Dim::Static(16), Dim::Static(8)],
    };
    static NORM: TensorDecl = TensorDecl {
        name: "norm",
        shape: &[Dim::Static(8)],
    };
    static X: TensorDecl = TensorDecl {
        name: "x",
        shape: &[Dim::Dynamic(0), Dim::Static(8)],
    };
    static Y: TensorDecl = TensorDecl {
        name: "y",
        shape: &[Dim::Dynamic(0), Dim::Static(8)],
    };

    fn f16_bytes(n: usize) -> Vec<u8> {
        let values: Vec<f16> = (0..n).map(|i| f16::from_f32(i as f32)).collect();
        <f16 as Element>::to_le_bytes(&values)
    }

    fn file(tensors: &[(&str, DType, &[usize])]) -> TensorFile {
        let tensors: Vec<_> = tensors
            .iter()
            .map(|(name, dtype, shape)| {
                let n: usize = shape.iter().product();
                let bytes = match dtype {
                    DType::F32 => <f32 as Element>::to_le_bytes(&vec![0.5; n]),
                    _ => f16_bytes(n),
                };
                (name.to_string(), *dtype, shape.to_vec(), bytes)
            })
            .collect();
        TensorFile::from_bytes("w.safetensors", serialize(&tensors).unwrap()).unwrap()
    }

    #[test]
    fn a_written_file_reads_back_with_its_tensors() {
        let file = file(&[("b", DType::F16, &[8]), ("a", DType::F32, &[2, 8])]);
        assert_eq!(file.names().collect::<Vec<_>>(), ["a", "b"]);
        let b = file.get("b").unwrap();
        assert_eq!((b.element_type(), b.shape), (Some(DType::F16), &[8][..]));
        assert_eq!(b.bytes, f16_bytes(8));
        let a = file.get("a").unwrap();
        assert_eq!(<f32 as Element>::from_le_bytes(a.bytes), vec![0.5; 16]);
        assert!(file.get("c").is_none());
    }

    #[test]
    fn bytes_that_are_not_safetensors_are_a_named_file_error() {
        for bytes in [Vec::new(), b"not a safetensors file".to_vec(), {
            // A header that claims more bytes than follow it.
            let mut b = 1000u64.to_le_bytes().to_vec();
            b.extend(b"{}");
            b
        }] {
            let e = TensorFile::from_bytes("w.safetensors", bytes).unwrap_err();
            assert!(matches!(e, Error::TensorFile { .. }), "{e}");
            assert!(
                e.to_string()
                    .starts_with("w.safetensors: not a safetensors file: "),
                "{e}"
            );
        }
        // Truncated: the last tensor's bytes are cut off.
        let mut bytes = serialize(&[("a".into(), DType::F16, vec![8], f16_bytes(8))]).unwrap();
        bytes.truncate(bytes.len() - 2);
        let e = TensorFile::from_bytes("w.safetensors", bytes).unwrap_err();
        assert!(matches!(e, Error::TensorFile { .. }), "{e}");
    }

    #[test]
    fn a_file_that_cannot_be_read_says_so() {
        let e = TensorFile::open("/nonexistent/w.safetensors").unwrap_err();
        assert!(matches!(e, Error::TensorFile { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("/nonexistent/w.safetensors: cannot read it: "),
            "{e}"
        );
    }

    #[test]
    fn a_file_that_never_ends_is_refused_once_its_header_is_read() {
        // /dev/zero: a header length of 0, so no header.
        let e = TensorFile::open("/dev/zero").unwrap_err();
        assert!(matches!(e, Error::TensorFile { .. }), "{e}");
        assert!(
            e.to_string().starts_with("/dev/zero: not a safetensors file: "),
            "{e}"
        );
        // A header, then bytes without end: read up to one byte past where
        // the header says the file ends.
        let file = serialize(&[("a".into(), DType::F16, vec![8], f16_bytes(8))]).unwrap();
        let mut endless = std::io::Read::chain(file.as_slice(), std::io::repeat(7));
        let bytes = read_safetensors("w.safetensors", &mut endless, 1 << 20).unwrap();
        assert_eq!(bytes.len(), file.len() + 1);
        assert!(matches!(
            TensorFile::from_bytes("w.safetensors", bytes),
            Err(Error::TensorFile { .. })
        ));
    }

    #[test]
    fn a_file_larger_than_the_limit_is_refused_before_its_tensors_are_read() {
        let file = serialize(&[("a".into(), DType::F16, vec![64], f16_bytes(64))]).unwrap();
        let header_end = 8 + u64::from_le_bytes(file[..8].try_into().unwrap());
        let whole = file.len() as u64;
        // By its size, unread.
        let path = std::env::temp_dir().join(format!("fusion-weights-{}.safetensors", std::process::id()));
        std::fs::write(&path, &file).unwrap();
        let e = open_within(&path, whole - 1).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(e, Error::TensorFileTooLarge { bytes, by: "its size", limit, .. } if bytes == whole && limit == whole - 1),
            "{e}"
        );
        // By its header, from a stream of no stated size: nothing past the
        // header is read.
        let mut stream = file.as_slice();
        let e = read_safetensors("w.safetensors", &mut stream, whole - 1).unwrap_err();
        assert!(
            matches!(e, Error::TensorFileTooLarge { bytes, by: "as its header says", .. } if bytes == whole),
            "{e}"
        );
        assert_eq!(stream.len() as u64, whole - header_end);
        assert_eq!(
            e.to_string(),
            format!(
                "w.safetensors: it holds {whole} bytes (as its header says), more than the {} a tensor file may have, \
                 since it is read whole into host memory; pass a file of the tensors the graph reads",
                whole - 1
            )
        );
        // A header length past the limit: not safetensors, and only those
        // 8 bytes are read.
        let mut stream = file.as_slice();
        let bytes = read_safetensors("w.safetensors", &mut stream, header_end - 1).unwrap();
        assert_eq!(bytes, file[..8]);
        assert_eq!(stream.len(), file.len() - 8);
        // At the limit, it reads.
        let mut stream = file.as_slice();
        assert_eq!(
            read_safetensors("w.safetensors", &mut stream, whole).unwrap(),
            file
        );
    }

    #[test]
    fn names_default_to_the_declaration_and_map_to_hugging_face() {
        assert_eq!(TensorNames::declared().in_file("w_gate"), "w_gate");
        let hf = TensorNames::hugging_face(3);
        assert_eq!(hf.in_file("w_gate"), "model.layers.3.mlp.gate_proj.weight");
        assert_eq!(hf.in_file("w_up"), "model.layers.3.mlp.up_proj.weight");
        assert_eq!(hf.in_file("w_down"), "model.layers.3.mlp.down_proj.weight");
        assert_eq!(
            hf.in_file("norm"),
            "model.layers.3.post_attention_layernorm.weight"
        );
        assert_eq!(
            hf.in_file("gamma"),
            "model.layers.3.post_attention_layernorm.weight"
        );
        assert_eq!(hf.in_file("b_down"), "model.layers.3.b_down");
        let renamed = TensorNames::with_prefix("blk.")
            .rename("w_up", "up")
            .rename("w_up", "ffn_up");
        assert_eq!(renamed.in_file("w_up"), "blk.ffn_up");
        assert_eq!(renamed.in_file("x"), "blk.x");
    }

    #[test]
    fn checked_tensors_bind_under_their_mapped_names() {
        let file = file(&[
            ("model.layers.0.mlp.gate_proj.weight", DType::F16, &[16, 8]),
            ("model.layers.0.post_attention_layernorm.weight", DType::F16, &[8]),
        ]);
        let names = TensorNames::hugging_face(0);
        let mut binder = Binder::new(&GRAPH, &file, &names);
        binder.check::<f16>(&[&W_GATE, &NORM]).unwrap();
        let (view, shape) = binder.checked::<f16>(&W_GATE).unwrap();
        assert_eq!((shape, view.bytes.len()), (Shape::Matrix(16, 8), 16 * 8 * 2));
    }

    #[test]
    fn a_missing_tensor_names_the_file_the_name_and_the_graphs_tensor() {
        let file = file(&[("model.layers.0.w_gate", DType::F16, &[16, 8])]);
        let names = TensorNames::declared();
        let e = Binder::new(&GRAPH, &file, &names)
            .check::<f16>(&[&W_GATE])
            .unwrap_err();
        assert!(matches!(e, Error::MissingTensor { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "w.safetensors has no tensor `w_gate` (the graph's `w_gate`); it holds 1: \
             `model.layers.0.w_gate`; `model.layers.0.w_gate` ends with it: give its prefix in the tensor names"
        );
        let names = TensorNames::hugging_face(1);
        let e = Binder::new(&GRAPH, &file, &names)
            .check::<f16>(&[&W_GATE])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "w.safetensors has no tensor `model.layers.1.mlp.gate_proj.weight` (the graph's `w_gate`); it holds 1: `model.layers.0.w_gate`"
        );
        let many: Vec<(String, DType, Vec<usize>, Vec<u8>)> = (0..6)
            .map(|i| (format!("t{i}"), DType::F16, vec![8], f16_bytes(8)))
            .collect();
        let file = TensorFile::from_bytes("w.safetensors", serialize(&many).unwrap()).unwrap();
        let e = file.missing("w_up", "w_up").to_string();
        assert!(e.ends_with("it holds 6, such as `t0`, `t1`, `t2`, `t3`"), "{e}");
    }

    #[test]
    fn a_tensor_of_another_dtype_is_named_with_both_types() {
        let file = file(&[("w_gate", DType::F32, &[16, 8])]);
        let names = TensorNames::declared();
        let e = Binder::new(&GRAPH, &file, &names)
            .check::<f16>(&[&W_GATE])
            .unwrap_err();
        assert!(matches!(e, Error::TensorDType { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "`w_gate` in w.safetensors (the graph's `w_gate`) holds F32 elements, but the graph runs in f16: \
             convert the file, or run the graph in the file's element type"
        );
    }

    #[test]
    fn a_tensor_of_another_shape_or_rank_is_named_with_both_shapes() {
        let names = TensorNames::declared();
        for (shape, actual) in [
            (&[8, 16][..], "[8, 16]"),
            (&[128], "[128]"),
            (&[2, 8, 8], "[2, 8, 8]"),
        ] {
            let file = file(&[("w_gate", DType::F16, shape)]);
            let e = Binder::new(&GRAPH, &file, &names)
                .check::<f16>(&[&W_GATE])
                .unwrap_err();
            assert!(matches!(e, Error::TensorShape { .. }), "{e}");
            assert_eq!(
                e.to_string(),
                format!(
                    "`w_gate` in w.safetensors (the graph's `w_gate`) has shape {actual} but the graph declares [16, 8]"
                )
            );
        }
    }

    #[test]
    fn dynamic_dims_are_read_from_the_tensors_and_must_agree() {
        let file = file(&[("x", DType::F16, &[5, 8]), ("y", DType::F16, &[6, 8])]);
        let names = TensorNames::declared();
        let mut binder = Binder::new(&GRAPH, &file, &names);
        let (_, shape) = binder.checked::<f16>(&X).unwrap();
        assert_eq!(shape, Shape::Matrix(5, 8));
        let e = binder.checked::<f16>(&Y).unwrap_err();
        assert!(matches!(e, Error::DimMismatch { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "dim `M` is 5 in `x` but 6 in `y`: pass tensors that agree"
        );
    }
}
