//! Symmetric heap (placeholder, written next).
