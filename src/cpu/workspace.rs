//! Per-thread scratch memory: allocated once per thread, grown when a larger problem comes, and
//! carved into 64-byte-aligned slices for each work item. No allocation in the loops.

use core::cell::RefCell;

/// One cache line; the unit of workspace, so every carved slice starts 64-byte aligned.
#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
pub(crate) struct Line([u8; 64]);

impl Line {
    pub const ZERO: Line = Line([0; 64]);
}

thread_local! {
    static WORKSPACE: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's workspace of at least `lines` lines.
pub(crate) fn with_workspace<R>(lines: usize, f: impl FnOnce(&mut Carver) -> R) -> R {
    WORKSPACE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffer) => {
            if buffer.len() < lines {
                buffer.resize(lines, Line::ZERO);
            }
            f(&mut Carver { rest: &mut buffer[..] })
        }
        // Only reachable if a caller nests calls on one thread; stay correct, pay an allocation.
        Err(_) => f(&mut Carver { rest: &mut vec![Line::ZERO; lines][..] }),
    })
}

/// Hands out consecutive, line-aligned, disjoint slices of a workspace.
pub(crate) struct Carver<'a> {
    rest: &'a mut [Line],
}

impl<'a> Carver<'a> {
    /// The next `n` elements of type `P` (their contents are whatever was there before).
    pub fn take<P: bytemuck::Pod>(&mut self, n: usize) -> &'a mut [P] {
        let lines = (n * core::mem::size_of::<P>()).div_ceil(64);
        let rest = core::mem::take(&mut self.rest);
        assert!(lines <= rest.len(), "workspace too small: sized by workspace_lines");
        let (head, tail) = rest.split_at_mut(lines);
        self.rest = tail;
        &mut bytemuck::cast_slice_mut::<Line, P>(head)[..n]
    }
}
