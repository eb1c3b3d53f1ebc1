//! leader
