//! Raw, `Copy` handles on `[tokens, heads, dims]` tensors, so that work items on many threads can
//! read rows of the inputs and write disjoint rows of the outputs.

use core::marker::PhantomData;
use ndarray::{ArrayView1, ArrayView2, ArrayView3, ArrayView4, ArrayViewMut2, ArrayViewMut3, ShapeBuilder};

/// `[a, b, c]` of a rank-3 view.
pub(crate) fn shape3<T>(view: &ArrayView3<T>) -> [usize; 3] {
    let (a, b, c) = view.dim();
    [a, b, c]
}

/// Read access to the rows (one token, one head) of a `[tokens, heads, dims]` view.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a, T> {
    ptr: *const T,
    shape: [usize; 3],
    strides: [isize; 3],
    _borrow: PhantomData<&'a T>,
}

// SAFETY: `Rows` is a shared borrow of `T`s (like `&'a [T]`), so it may cross threads when `T`
// may be shared.
unsafe impl<T: Sync> Send for Rows<'_, T> {}
// SAFETY: as above: only shared reads go through it.
unsafe impl<T: Sync> Sync for Rows<'_, T> {}

impl<'a, T> Rows<'a, T> {
    pub fn new(view: &ArrayView3<'a, T>) -> Self {
        let s = view.strides();
        Rows {
            ptr: view.as_ptr(),
            shape: [view.dim().0, view.dim().1, view.dim().2],
            strides: [s[0], s[1], s[2]],
            _borrow: PhantomData,
        }
    }

    /// The `dims` values of `(token, head)`; contiguous when the view's last axis is.
    #[inline]
    pub fn row(&self, token: usize, head: usize) -> ArrayView1<'a, T> {
        assert!(token < self.shape[0] && head < self.shape[1], "row ({token}, {head}) outside {:?}", self.shape);
        let offset = token as isize * self.strides[0] + head as isize * self.strides[1];
        // SAFETY: the indices are inside the view's shape (checked above).
        unsafe { row_at(self.ptr, offset, self.shape[2], self.strides[2]) }
    }
}

/// The `[heads, dims]` elements of one token from `ptr + offset`, as a view, when both strides
/// are non-negative (else `None`: the caller reads row by row).
///
/// # Safety
/// Those elements must belong to one view that `'a` borrows immutably.
#[inline]
unsafe fn token_at<'a, T>(
    ptr: *const T,
    offset: isize,
    shape: [usize; 2],
    strides: [isize; 2],
) -> Option<ArrayView2<'a, T>> {
    if strides[0] < 0 || strides[1] < 0 {
        return None;
    }
    let strides = (strides[0] as usize, strides[1] as usize);
    // SAFETY: per the caller; the strides are non-negative.
    Some(unsafe { ArrayView2::from_shape_ptr((shape[0], shape[1]).strides(strides), ptr.offset(offset)) })
}

/// The `len` elements `stride` apart from `ptr + offset`, as a view.
///
/// # Safety
/// Those elements must belong to one view that `'a` borrows immutably.
#[inline]
unsafe fn row_at<'a, T>(ptr: *const T, offset: isize, len: usize, stride: isize) -> ArrayView1<'a, T> {
    // ndarray wants non-negative strides here: start from the row's lowest address and flip the
    // axis back afterwards.
    let lowest = if stride < 0 && len > 0 { offset + (len as isize - 1) * stride } else { offset };
    // SAFETY: per the caller, the row's `len` elements, `|stride|` apart from its lowest
    // address, all belong to a view borrowed immutably for `'a`.
    let mut row = unsafe { ArrayView1::from_shape_ptr((len,).strides((stride.unsigned_abs(),)), ptr.offset(lowest)) };
    if stride < 0 {
        row.invert_axis(ndarray::Axis(0));
    }
    row
}

/// A read handle on a paged cache `[num_blocks, block_size, heads, dims]` (FlashAttention-2's
/// layout of a paged K or V cache).
#[derive(Clone, Copy)]
pub(crate) struct PagedRows<'a, T> {
    ptr: *const T,
    shape: [usize; 4],
    strides: [isize; 4],
    _borrow: PhantomData<&'a T>,
}

// SAFETY: as for `Rows`: a shared borrow.
unsafe impl<T: Sync> Send for PagedRows<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for PagedRows<'_, T> {}

impl<'a, T> PagedRows<'a, T> {
    pub fn new(view: &ArrayView4<'a, T>) -> Self {
        let s = view.strides();
        let (a, b, c, d) = view.dim();
        PagedRows { ptr: view.as_ptr(), shape: [a, b, c, d], strides: [s[0], s[1], s[2], s[3]], _borrow: PhantomData }
    }

    /// The block and slot that hold key `j` of sequence `sequence` under `table`.
    #[inline]
    pub fn locate(&self, table: &BlockTable, sequence: usize, j: usize) -> (usize, usize) {
        let size = self.shape[1];
        (table.get(sequence, j / size) as usize, j % size)
    }

    /// The `dims` values of slot `slot` of block `block`, head `head`.
    #[inline]
    pub fn row(&self, block: usize, slot: usize, head: usize) -> ArrayView1<'a, T> {
        assert!(
            block < self.shape[0] && slot < self.shape[1] && head < self.shape[2],
            "row ({block}, {slot}, {head}) outside {:?}",
            self.shape
        );
        let offset =
            block as isize * self.strides[0] + slot as isize * self.strides[1] + head as isize * self.strides[2];
        // SAFETY: the indices are inside the view's shape (checked above).
        unsafe { row_at(self.ptr, offset, self.shape[3], self.strides[3]) }
    }
}

/// A read handle on a `block_table [batch, max_blocks]` (validated: every entry a sequence's
/// keys reach names a block of the cache).
#[derive(Clone, Copy)]
pub(crate) struct BlockTable<'a> {
    ptr: *const i32,
    shape: [usize; 2],
    strides: [isize; 2],
    _borrow: PhantomData<&'a i32>,
}

// SAFETY: a shared borrow of `i32`s.
unsafe impl Send for BlockTable<'_> {}
// SAFETY: as above.
unsafe impl Sync for BlockTable<'_> {}

impl<'a> BlockTable<'a> {
    pub fn new(view: &ArrayView2<'a, i32>) -> Self {
        let (a, b) = view.dim();
        BlockTable {
            ptr: view.as_ptr(),
            shape: [a, b],
            strides: [view.strides()[0], view.strides()[1]],
            _borrow: PhantomData,
        }
    }

    /// Entry `entry` of sequence `sequence`'s row.
    #[inline]
    pub fn get(&self, sequence: usize, entry: usize) -> i32 {
        assert!(
            sequence < self.shape[0] && entry < self.shape[1],
            "block_table[{sequence}, {entry}] outside {:?}",
            self.shape
        );
        // SAFETY: inside the shape (checked above); a shared read of the borrowed view.
        unsafe { *self.ptr.offset(sequence as isize * self.strides[0] + entry as isize * self.strides[1]) }
    }
}

/// Where a call's keys (or values) live: one packed tensor along `cu_seqlens_k`, or a paged
/// cache with its block table.
#[derive(Clone, Copy)]
pub(crate) enum KvRows<'a, T> {
    /// `[total_k, heads, dims]`: key `j` of the sequence starting at token `s` is row `s + j`.
    Packed(Rows<'a, T>),
    /// Key `j` of sequence `b` is slot `j % block_size` of block `block_table[b, j / block_size]`.
    Paged(PagedRows<'a, T>, BlockTable<'a>),
}

impl<'a, T> KvRows<'a, T> {
    /// Key `j` of sequence `index` (whose first packed token is `first`), every kv head:
    /// `[heads, dims]`, or `None` where a stride is negative.
    #[inline]
    pub fn token(&self, index: usize, first: usize, j: usize) -> Option<ArrayView2<'a, T>> {
        match self {
            KvRows::Packed(rows) => {
                let token = first + j;
                assert!(token < rows.shape[0], "token {token} outside {:?}", rows.shape);
                let offset = token as isize * rows.strides[0];
                let (shape, strides) = ([rows.shape[1], rows.shape[2]], [rows.strides[1], rows.strides[2]]);
                // SAFETY: the token is inside the view (checked above); its heads and dims are
                // the view's.
                unsafe { token_at(rows.ptr, offset, shape, strides) }
            }
            KvRows::Paged(cache, table) => {
                let (block, slot) = cache.locate(table, index, j);
                assert!(block < cache.shape[0], "block {block} outside {:?}", cache.shape);
                let offset = block as isize * cache.strides[0] + slot as isize * cache.strides[1];
                let (shape, strides) = ([cache.shape[2], cache.shape[3]], [cache.strides[2], cache.strides[3]]);
                // SAFETY: block and slot are inside the cache (checked above, slot by the
                // modulo); its heads and dims are the view's.
                unsafe { token_at(cache.ptr, offset, shape, strides) }
            }
        }
    }
}

/// The key (or value) rows of one sequence and kv head. The one accessor the CPU packers read
/// K and V through: the addressing (packed or paged) is decided here alone.
#[derive(Clone, Copy)]
pub(crate) struct SequenceRows<'r, 'a, T> {
    kv: &'r KvRows<'a, T>,
    /// Packed: the sequence's first token. Paged: its row of the block table.
    sequence: usize,
    head: usize,
}

impl<'r, 'a, T> SequenceRows<'r, 'a, T> {
    /// The keys of `head` in sequence `index` (whose first packed token is `first`).
    pub fn new(kv: &'r KvRows<'a, T>, index: usize, first: usize, head: usize) -> Self {
        let sequence = match kv {
            KvRows::Packed(_) => first,
            KvRows::Paged(..) => index,
        };
        SequenceRows { kv, sequence, head }
    }

    /// Key `j` of the sequence: its `dims` values.
    #[inline]
    pub fn row(&self, j: usize) -> ArrayView1<'a, T> {
        match self.kv {
            KvRows::Packed(rows) => rows.row(self.sequence + j, self.head),
            KvRows::Paged(cache, table) => {
                let (block, slot) = cache.locate(table, self.sequence, j);
                cache.row(block, slot, self.head)
            }
        }
    }

    /// Values per row.
    #[inline]
    pub fn dims(&self) -> usize {
        match self.kv {
            KvRows::Packed(rows) => rows.shape[2],
            KvRows::Paged(cache, _) => cache.shape[3],
        }
    }
}

/// Write access to the rows of an output view, shared by the work items of one call.
#[derive(Clone, Copy)]
pub(crate) struct RowsMut<'a, T> {
    ptr: *mut T,
    shape: [usize; 3],
    strides: [isize; 3],
    _borrow: PhantomData<&'a mut T>,
}

// SAFETY: the handle stands for a unique borrow of the output; threads write disjoint rows (see
// `write_row`), so sending it is like sending disjoint `&mut` slices.
unsafe impl<T: Send> Send for RowsMut<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for RowsMut<'_, T> {}

impl<'a, T: Copy> RowsMut<'a, T> {
    pub fn new(view: &'a mut ArrayViewMut3<'_, T>) -> Self {
        let s = view.strides();
        let strides = [s[0], s[1], s[2]];
        let (a, b, c) = view.dim();
        RowsMut { ptr: view.as_mut_ptr(), shape: [a, b, c], strides, _borrow: PhantomData }
    }

    /// Writes `f(d)` for every `d < dims` into row `(token, head)`.
    ///
    /// # Safety
    /// No other thread may access row `(token, head)` during the call.
    #[inline]
    pub unsafe fn write_row(&self, token: usize, head: usize, f: impl Fn(usize) -> T) {
        assert!(token < self.shape[0] && head < self.shape[1], "row ({token}, {head}) outside {:?}", self.shape);
        let base = token as isize * self.strides[0] + head as isize * self.strides[1];
        for d in 0..self.shape[2] {
            // SAFETY: the indices are inside the shape (checked above); a mutable ndarray view
            // never maps two indices to one element, and the caller guarantees no other thread
            // touches this row.
            unsafe { *self.ptr.offset(base + d as isize * self.strides[2]) = f(d) };
        }
    }
}

/// Write access to an LSE view `[heads, total_q]`.
#[derive(Clone, Copy)]
pub(crate) struct LseMut<'a> {
    ptr: *mut f32,
    shape: [usize; 2],
    strides: [isize; 2],
    _borrow: PhantomData<&'a mut f32>,
}

// SAFETY: as for `RowsMut`: threads write disjoint elements.
unsafe impl Send for LseMut<'_> {}
// SAFETY: as above.
unsafe impl Sync for LseMut<'_> {}

impl<'a> LseMut<'a> {
    pub fn new(view: &'a mut ArrayViewMut2<'_, f32>) -> Self {
        let strides = [view.strides()[0], view.strides()[1]];
        let (a, b) = view.dim();
        LseMut { ptr: view.as_mut_ptr(), shape: [a, b], strides, _borrow: PhantomData }
    }

    /// Stores the LSE of `(head, token)`.
    ///
    /// # Safety
    /// No other thread may access that element during the call.
    #[inline]
    pub unsafe fn write(&self, head: usize, token: usize, value: f32) {
        assert!(head < self.shape[0] && token < self.shape[1], "lse ({head}, {token}) outside {:?}", self.shape);
        // SAFETY: inside the shape (checked above); unique per the caller's guarantee.
        unsafe { *self.ptr.offset(head as isize * self.strides[0] + token as isize * self.strides[1]) = value };
    }
}
