"""Framework adapters: ``ctxcore.integrations.langchain`` (extra ``[langchain]``) and
``ctxcore.integrations.openai_agents`` (extra ``[agents]``). Import the one you use: each
needs its framework installed."""
