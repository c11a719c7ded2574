//! Shared by the fuzz test (a small run) and the fuzz bench (≥ 100k cases): proptest strategies
//! for action requests — arbitrary JSON, and valid requests with one part mutated.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

pub fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,24}".prop_map(Value::String),
        prop_oneof![
            Just("n0"),
            Just("n1"),
            Just("base"),
            Just("add2"),
            Just("dev"),
            Just("test"),
            Just(".."),
            Just("n99999999999")
        ]
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid request for each action (on the example study), to mutate.
pub fn templates() -> Vec<(&'static str, Value)> {
    vec![
        (
            "branch",
            json!({"parents": ["n0"], "title": "t", "hypothesis": "h"}),
        ),
        (
            "register_dataset",
            json!({"node": "n0", "name": "d", "source": {"kind": "inline", "rows": [{"prompt": "1+1=", "answer": "2"}]}}),
        ),
        (
            "register_dataset",
            json!({"node": "n0", "name": "g", "source": {"kind": "arith", "op": "add", "digits": 1, "format": "plain", "n": 3, "seed": 1}}),
        ),
        (
            "run_sft",
            json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": 1, "batch_size": 1}),
        ),
        (
            "evaluate",
            json!({"node": "n0", "checkpoint": "base", "task": "add2", "split": "dev"}),
        ),
        (
            "compare",
            json!({"node": "n0", "nodes": ["n0", "n1"], "task": "add2"}),
        ),
        (
            "review",
            json!({"node": "n0", "summary": "s", "verdicts": [{"node": "n0", "verdict": "promising", "reason": "r"}]}),
        ),
        (
            "conclude",
            json!({"node": "n1", "outcome": "negative", "findings": "f"}),
        ),
        ("get_node", json!({"node": "n0"})),
        ("list_nodes", json!({"limit": 5})),
        ("dag", json!({"view": "related", "node": "n0"})),
        ("log", json!({"limit": 3})),
        ("get_job", json!({"job": "j-0123456789abcdef"})),
    ]
}

/// Replace, delete or add one field somewhere in a request.
fn mutate(v: &Value, path_pick: usize, op: u8, new: Value, key: String) -> Value {
    let mut v = v.clone();
    fn walk(v: &mut Value, pick: &mut usize, op: u8, new: &Value, key: &str) -> bool {
        if *pick == 0 {
            match (op % 3, &mut *v) {
                (0, _) => *v = new.clone(),
                (1, Value::Object(m)) => {
                    if let Some(k) = m.keys().next().cloned() {
                        m.remove(&k);
                    }
                }
                (_, Value::Object(m)) => {
                    m.insert(key.to_string(), new.clone());
                }
                (_, other) => *other = new.clone(),
            }
            return true;
        }
        *pick -= 1;
        match v {
            Value::Object(m) => m.values_mut().any(|c| walk(c, pick, op, new, key)),
            Value::Array(a) => a.iter_mut().any(|c| walk(c, pick, op, new, key)),
            _ => false,
        }
    }
    let mut pick = path_pick;
    walk(&mut v, &mut pick, op, &new, &key);
    v
}

pub fn arb_request() -> impl Strategy<Value = (String, Value)> {
    let names: Vec<&'static str> = templates().iter().map(|(n, _)| *n).collect();
    prop_oneof![
        // any action name (or garbage) with arbitrary JSON
        (
            prop_oneof![
                prop::sample::select(names).prop_map(str::to_string),
                "[a-z_]{0,12}"
            ],
            arb_json()
        ),
        // a valid request with one mutation
        (
            prop::sample::select(templates()),
            0usize..12,
            any::<u8>(),
            arb_json(),
            "[a-z_]{1,10}"
        )
            .prop_map(|((name, t), pick, op, new, key)| (
                name.to_string(),
                mutate(&t, pick, op, new, key)
            )),
    ]
}

pub fn empty_object() -> Value {
    Value::Object(Map::new())
}
