-- wrk script: routing-only completions (max_tokens 0): the request goes
-- through the module (body, JSON, segments, engine slot) and the engine
-- (tokenize, schedule, final record) but runs no model step.
wrk.method = "POST"
wrk.body = '{"prompt":"Route me.","max_tokens":0}'
wrk.headers["Content-Type"] = "application/json"
