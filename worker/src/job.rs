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

    /// The example job file trains what it declares: the model's tables, with its shared
    /// optimizer and codec.
    #[test]
    fn the_example_job_file_declares_the_tables_it_trains() {
        let spec = job_from_toml(include_str!("../../scheduler/jobs/fashion-mnist.toml")).unwrap();
        let names: Vec<&str> = spec.tables.iter().map(|t| t.spec.name.as_str()).collect();
        let model = model_tables(&spec).unwrap();
        let trained: Vec<&str> = model.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, trained);
        assert_eq!(names, ["fmnist/w0", "fmnist/b0"]);
        for t in &spec.tables {
            assert!(
                matches!(t.spec.optimizer, Optimizer::Momentum { learning_rate, momentum, .. } if learning_rate == 0.1 && momentum == 0.9),
                "{:?}",
                t.spec.optimizer
            );
            assert_eq!(t.codec.to_string(), "fp16");
        }
    }

    /// A table the model does not train, or one of another shape, is refused, naming the
    /// model's tables.
    #[test]
    fn a_table_the_model_does_not_train_is_refused() {
        let head = "name = \"fm\"\nconsistency = \"bsp\"\nnum_shards = 1\nnum_workers = 1\n\
                    dataset = \"fashion-mnist\"\nmodel = \"softmax\"\n";
        let cases = [
            (
                "[[tables]]\nname = \"softmax/w\"\nshape = [785, 10]\n",
                "is not one model `softmax` trains",
            ),
            (
                "[[tables]]\nname = \"fm/w0\"\nshape = [785, 10]\n",
                "declared dense [785, 10], but model `softmax` trains it as dense [784, 10]",
            ),
            (
                "[[tables]]\nname = \"fm/b0\"\ndim = 10\n",
                "but model `softmax` trains it as dense [10]",
            ),
        ];
        for (tables, want) in cases {
            let e = job_from_toml(&format!("{head}{tables}")).unwrap_err();
            assert!(e.reason.contains(want), "{tables}: {e}");
            assert!(
                e.reason.contains("`fm/w0` (dense [784, 10])") || !want.contains("trains,"),
                "{e}"
            );
        }
        // A table of the model by its own name, with its own settings, is fine.
        let spec = job_from_toml(&format!(
            "{head}[[tables]]\nname = \"fm/b0\"\nshape = [10]\noptimizer = \"adam\"\n"
        ))
        .unwrap();
        assert!(matches!(
            spec.table("fm/b0").unwrap().spec.optimizer,
            Optimizer::Adam { .. }
        ));
    }
}
