//! The names the command line gives core types (task families, answer formats, fsync choices,
//! strategies), so that the core types stay free of clap.

use crate::api::types::AnswerFormat;

impl clap::ValueEnum for crate::train::Family {
    fn value_variants<'a>() -> &'a [Self] {
        &crate::train::Family::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

impl clap::ValueEnum for AnswerFormat {
    fn value_variants<'a>() -> &'a [Self] {
        &AnswerFormat::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

impl clap::ValueEnum for crate::bench::cli_cost::FsyncChoice {
    fn value_variants<'a>() -> &'a [Self] {
        use crate::bench::cli_cost::FsyncChoice;
        &[FsyncChoice::On, FsyncChoice::Off, FsyncChoice::Both]
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use crate::bench::cli_cost::FsyncChoice;
        Some(clap::builder::PossibleValue::new(match self {
            FsyncChoice::On => "on",
            FsyncChoice::Off => "off",
            FsyncChoice::Both => "both",
        }))
    }
}

impl clap::ValueEnum for crate::campaign::Strategy {
    fn value_variants<'a>() -> &'a [Self] {
        &crate::campaign::Strategy::CHOICES
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}
