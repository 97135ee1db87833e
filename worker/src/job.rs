//! Job specs for training: the tables a job's model needs, added to the spec from its TOML.

use ps_core::{JobSpec, TableSpec, ValidationError};

use crate::data::DatasetSpec;
use crate::model::ModelSpec;

/// The tables the job's model keeps on the shards (none when the job names no model).
pub fn model_tables(spec: &JobSpec) -> Result<Vec<TableSpec>, ValidationError> {
    if spec.model.is_empty() {
        return Ok(Vec::new());
    }
    let model =
        ModelSpec::parse(&spec.model).map_err(|e| ValidationError::new("model", e.to_string()))?;
    let data = DatasetSpec::parse(&spec.dataset)
        .map_err(|e| ValidationError::new("dataset", e.to_string()))?;
    let (input, classes) = data.shape();
    model
        .tables(&spec.name, input, classes, spec.seed)
        .map_err(|e| ValidationError::new("model", e.to_string()))
}

/// A job from its TOML form, with the model's tables added (see
/// [`JobSpec::from_toml_for_model`]: a `[model_tables]` section sets their optimizer and codec).
pub fn job_from_toml(text: &str) -> Result<JobSpec, ValidationError> {
    JobSpec::from_toml_for_model(text, model_tables)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ps_core::Optimizer;

    #[test]
    fn model_tables_take_the_shared_settings_and_listed_tables_win() {
        let spec = job_from_toml(
            r#"
name = "fm"
consistency = "bsp"
num_shards = 2
num_workers = 2
dataset = "fashion-mnist"
model = "mlp:32"

[model_tables]
optimizer = "momentum"
learning_rate = 0.05
codec = "topk:0.01"

[[tables]]
name = "fm/b1"
shape = [10]
optimizer = "adam"
"#,
        )
        .unwrap();
        let names: Vec<&str> = spec.tables.iter().map(|t| t.spec.name.as_str()).collect();
        assert_eq!(names, ["fm/b1", "fm/w0", "fm/b0", "fm/w1"]);
        let w0 = spec.table("fm/w0").unwrap();
        assert!(
            matches!(w0.spec.optimizer, Optimizer::Momentum { learning_rate, .. } if learning_rate == 0.05)
        );
        assert!(
            w0.codec.to_string().starts_with("topk:0.01"),
            "{}",
            w0.codec
        );
        // He initialization of the hidden layer survives the shared section.
        assert!(matches!(
            w0.spec.initializer.kind,
            ps_core::InitializerKind::Normal { .. }
        ));
        assert!(matches!(
            spec.table("fm/b1").unwrap().spec.optimizer,
            Optimizer::Adam { .. }
        ));

        let e = job_from_toml("name = \"x\"\nconsistency = \"bsp\"\nnum_shards = 1\nnum_workers = 1\ndataset = \"adult\"\nmodel = \"mlp:8\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("dense inputs"), "{e}");
    }
}
