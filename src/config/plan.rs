//! TODO stub
pub struct Plan;
