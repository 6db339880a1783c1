//! proxy (todo)
