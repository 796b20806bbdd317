//! One file per subcommand: glue only.
