-- Prepended to idem_renew.lua and idem_confirm_store.lua when loaded.
-- Whether `raw` is `owner`'s claim in progress: read by pattern when the record spells the
-- token as it is, else decoded (JSON may escape characters of it, `/` as `\/`).
local function owned(raw, owner)
  if string.find(raw, '"status":"in_progress"', 1, true)
      and string.find(raw, '"owner":"' .. owner .. '"', 1, true) then
    return true
  end
  local ok, rec = pcall(cjson.decode, raw)
  return ok and type(rec) == 'table' and rec.status == 'in_progress' and rec.owner == owner
end
