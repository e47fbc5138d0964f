//! A global allocator that counts the allocations made on each thread (a
//! test binary declares it its `#[global_allocator]`, then reads
//! [`allocations`] around what it counts, on the polling thread).
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// `System`, counting.
pub struct Counting;

thread_local! {
    /// Allocations made on this thread.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Allocations (and reallocations) made on this thread so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is passed on to `System` unchanged; the count is a
// thread-local `Cell` with a constant initialiser (no allocation, no
// destructor), so counting never re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
