//! Weights on every node before any engine starts: the head's file list, the presence check
//! on each node (`model.sync: shared`), and `rsync` over ssh with the page cache kept small
//! (`model.sync: rsync`).

pub mod cachecap;
pub mod listing;
pub mod rsync;
