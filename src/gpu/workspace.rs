//! The key-split workspace (partial outputs and LSEs of split launches), kept between calls by
//! each runtime: launches on one device are ordered on its one stream, so one buffer, grown when
//! a plan needs more, serves them all. Shared by the CUDA and HIP runtimes.

use crate::error::Error;
use std::sync::{Mutex, MutexGuard};

/// A device buffer `B` of some byte length, reused from call to call.
pub(crate) struct Workspace<B> {
    slot: Mutex<Option<(B, usize)>>,
}

impl<B> Workspace<B> {
    pub fn new() -> Self {
        Workspace { slot: Mutex::new(None) }
    }

    /// The workspace for one launch of `bytes` (0: none), locked until the guard drops. A
    /// smaller buffer is freed first, then `alloc` makes one of `bytes`.
    pub fn at_least(
        &self,
        bytes: usize,
        alloc: impl FnOnce(usize) -> Result<B, Error>,
    ) -> Result<WorkspaceGuard<'_, B>, Error> {
        let mut slot = self.slot.lock().map_err(|_| Error::Gpu("the workspace lock was poisoned by a panic".into()))?;
        if bytes > 0 && slot.as_ref().is_none_or(|&(_, len)| len < bytes) {
            *slot = None;
            *slot = Some((alloc(bytes)?, bytes));
        }
        Ok(WorkspaceGuard { slot, needed: bytes > 0 })
    }
}

/// A locked workspace: the buffer while the launch needs one.
pub(crate) struct WorkspaceGuard<'a, B> {
    slot: MutexGuard<'a, Option<(B, usize)>>,
    needed: bool,
}

impl<B> WorkspaceGuard<'_, B> {
    /// The buffer, or `None` when the launch has no key splits.
    pub fn buffer(&self) -> Option<&B> {
        self.slot.as_ref().filter(|_| self.needed).map(|(buffer, _)| buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_only_when_a_launch_needs_more_and_lends_nothing_without_splits() {
        let workspace = Workspace::<Vec<u8>>::new();
        let allocations = std::cell::RefCell::new(Vec::new());
        let alloc = |n: usize| {
            allocations.borrow_mut().push(n);
            Ok(vec![0u8; n])
        };
        let length = |bytes: usize| workspace.at_least(bytes, alloc).unwrap().buffer().map(Vec::len);
        assert_eq!(length(0), None);
        assert_eq!(length(100), Some(100));
        assert_eq!(length(60), Some(100));
        assert_eq!(length(0), None);
        assert_eq!(length(300), Some(300));
        assert_eq!(*allocations.borrow(), [100, 300]);
        // A failed allocation leaves no buffer behind (the old one was freed first); the next
        // launch allocates again.
        assert!(workspace.at_least(400, |_| Err(Error::Gpu("out of device memory".into()))).is_err());
        assert_eq!(length(200), Some(200));
        assert_eq!(*allocations.borrow(), [100, 300, 200]);
    }
}
