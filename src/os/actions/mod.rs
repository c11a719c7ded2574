//! One file per action: each adds its `*_checked` method to `Study` (validate the semantics,
//! gather facts, ask the policy, run, record through the commit protocol).

mod branch;
mod compare;
mod conclude;
mod evaluate;
mod register_dataset;
mod review;
mod run_sft;
