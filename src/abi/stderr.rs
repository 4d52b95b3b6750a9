//! `__wrap_stderr`: the target of the `--wrap=stderr` link argument (build.rs). The
//! non-PIC libxdp.a that libxdp-sys bundles reads `stderr` PC-relative; wrapped, it reads
//! this copy, set from libc's `stderr` (`__real_stderr`) when the library is loaded. The
//! copy is a hidden symbol (defined below in assembly), so a PC-relative load reaches it.

use core::ffi::c_void;

core::arch::global_asm!(
    ".pushsection .data",
    ".globl __wrap_stderr",
    ".hidden __wrap_stderr",
    ".type __wrap_stderr, @object",
    ".size __wrap_stderr, 8",
    ".p2align 3",
    "__wrap_stderr: .quad 0",
    ".popsection",
);

unsafe extern "C" {
    /// libc's `stderr` (the linker maps `__real_stderr` to it under `--wrap`).
    static __real_stderr: *mut c_void;
    static mut __wrap_stderr: *mut c_void;
}

extern "C" fn init() {
    // SAFETY: runs once when the library is loaded, before any of its code can print (no
    // concurrent access); reads libc's initialised `stderr`.
    unsafe { __wrap_stderr = __real_stderr };
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;
