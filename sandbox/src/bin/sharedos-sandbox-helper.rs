//! Stand-in for `sharedos __sandbox-exec` in this crate's tests: the host
//! binary's `main` does the same dispatch.

fn main() {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args
        .first()
        .is_some_and(|a| a == sharedos_sandbox::HELPER_SUBCOMMAND)
    {
        args.remove(0);
        sharedos_sandbox::helper_main(args);
    }
    eprintln!("usage: sharedos-sandbox-helper __sandbox-exec (the policy comes on fd 0)");
    std::process::exit(2);
}
