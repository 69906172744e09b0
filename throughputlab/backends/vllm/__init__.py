"""The vLLM generation backend (:mod:`.gen`), its engine's environment (:mod:`.env`), what the
engine reports about itself (:mod:`.info`) and its processes (:mod:`.procs`). Importing this
package imports no vllm; the backend's module does, when the registry loads it."""
