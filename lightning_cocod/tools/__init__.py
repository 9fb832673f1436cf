"""The measurement tools: cocod-bench (methods side by side on shaped links), cocod-demo,
cocod-plan (the cost model), the step timer, and the worker they start."""
