; ModuleID = "small"
target triple = "unknown-unknown-unknown"
target datalayout = ""

define void @"small"(ptr %".1", ptr %".2", ptr %".3", i32 %".4")
{
entry:
  %".6" = alloca <4 x float>
  %".7" = alloca <4 x float>
  br label %"i.body"
i.body:
  %"i" = phi  i64 [0, %"entry"], [%".130", %"i.body"]
  store <4 x float> splat (float              0x0), ptr %".6"
  store <4 x float> splat (float              0x0), ptr %".7"
  %".11" = mul nsw i64 %"i", 2
  %".12" = getelementptr inbounds float, ptr %".1", i64 %".11"
  %".13" = load <4 x float>, ptr %".2", align 4
  %".14" = load float, ptr %".12", align 4
  %".15" = insertelement <4 x float> poison, float %".14", i32 0
  %".16" = shufflevector <4 x float> %".15", <4 x float> poison, <4 x i32> zeroinitializer
  %".17" = load <4 x float>, ptr %".6"
  %".18" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".16", <4 x float> %".13", <4 x float> %".17")
  store <4 x float> %".18", ptr %".6"
  %".20" = getelementptr inbounds float, ptr %".12", i64 1
  %".21" = load float, ptr %".20", align 4
  %".22" = insertelement <4 x float> poison, float %".21", i32 0
  %".23" = shufflevector <4 x float> %".22", <4 x float> poison, <4 x i32> zeroinitializer
  %".24" = load <4 x float>, ptr %".7"
  %".25" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".23", <4 x float> %".13", <4 x float> %".24")
  store <4 x float> %".25", ptr %".7"
  %".27" = getelementptr inbounds float, ptr %".12", i64 6
  %".28" = getelementptr inbounds float, ptr %".2", i64 4
  %".29" = load <4 x float>, ptr %".28", align 4
  %".30" = load float, ptr %".27", align 4
  %".31" = insertelement <4 x float> poison, float %".30", i32 0
  %".32" = shufflevector <4 x float> %".31", <4 x float> poison, <4 x i32> zeroinitializer
  %".33" = load <4 x float>, ptr %".6"
  %".34" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".32", <4 x float> %".29", <4 x float> %".33")
  store <4 x float> %".34", ptr %".6"
  %".36" = getelementptr inbounds float, ptr %".27", i64 1
  %".37" = load float, ptr %".36", align 4
  %".38" = insertelement <4 x float> poison, float %".37", i32 0
  %".39" = shufflevector <4 x float> %".38", <4 x float> poison, <4 x i32> zeroinitializer
  %".40" = load <4 x float>, ptr %".7"
  %".41" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".39", <4 x float> %".29", <4 x float> %".40")
  store <4 x float> %".41", ptr %".7"
  %".43" = mul nsw i64 %"i", 8
  %".44" = getelementptr inbounds float, ptr %".3", i64 %".43"
  %".45" = load <4 x float>, ptr %".6"
  %".46" = fsub <4 x float> splat (float              0x0), %".45"
  %".47" = fcmp olt <4 x float> %".46", splat (float 0xc055d33340000000)
  %".48" = fcmp uno <4 x float> %".46", %".46"
  %".49" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".46", <4 x float> splat (float 0xc055d33340000000))
  %".50" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".49", <4 x float> splat (float 0x4056133340000000))
  %".51" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".50", <4 x float> splat (float 0x3ff7154760000000), <4 x float> splat (float 0x3fe0000000000000))
  %".52" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".51")
  %".53" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".52", <4 x float> splat (float 0xbfe6300000000000), <4 x float> %".50")
  %".54" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".52", <4 x float> splat (float 0x3f2bd01060000000), <4 x float> %".53")
  %".55" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> splat (float 0x3f2a0d2ce0000000), <4 x float> %".54", <4 x float> splat (float 0x3f56e879c0000000))
  %".56" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".55", <4 x float> %".54", <4 x float> splat (float 0x3f81112100000000))
  %".57" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".56", <4 x float> %".54", <4 x float> splat (float 0x3fa5553820000000))
  %".58" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".57", <4 x float> %".54", <4 x float> splat (float 0x3fc5555540000000))
  %".59" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".58", <4 x float> %".54", <4 x float> splat (float 0x3fe0000000000000))
  %".60" = fmul <4 x float> %".54", %".54"
  %".61" = fadd <4 x float> %".54", splat (float 0x3ff0000000000000)
  %".62" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".59", <4 x float> %".60", <4 x float> %".61")
  %".63" = fptosi <4 x float> %".52" to <4 x i32>
  %".64" = add <4 x i32> %".63", splat (i32 127)
  %".65" = shl <4 x i32> %".64", splat (i32 23)
  %".66" = bitcast <4 x i32> %".65" to <4 x float>
  %".67" = fmul <4 x float> %".62", %".66"
  %".68" = select  <4 x i1> %".47", <4 x float> splat (float              0x0), <4 x float> %".67"
  %".69" = select  <4 x i1> %".48", <4 x float> %".46", <4 x float> %".68"
  %".70" = fadd <4 x float> splat (float 0x3ff0000000000000), %".69"
  %".71" = fcmp ogt <4 x float> %".70", splat (float 0x43f0000000000000)
  %".72" = select  <4 x i1> %".71", <4 x float> splat (float 0x3ff0000000000000), <4 x float> %".70"
  %".73" = bitcast <4 x float> %".72" to <4 x i32>
  %".74" = sub <4 x i32> splat (i32 2129859011), %".73"
  %".75" = bitcast <4 x i32> %".74" to <4 x float>
  %".76" = fneg <4 x float> %".72"
  %".77" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".76", <4 x float> %".75", <4 x float> splat (float 0x3ff0000000000000))
  %".78" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".75", <4 x float> %".77", <4 x float> %".75")
  %".79" = fneg <4 x float> %".72"
  %".80" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".79", <4 x float> %".78", <4 x float> splat (float 0x3ff0000000000000))
  %".81" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".78", <4 x float> %".80", <4 x float> %".78")
  %".82" = fneg <4 x float> %".72"
  %".83" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".82", <4 x float> %".81", <4 x float> splat (float 0x3ff0000000000000))
  %".84" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".81", <4 x float> %".83", <4 x float> %".81")
  %".85" = select  <4 x i1> %".71", <4 x float> splat (float              0x0), <4 x float> %".84"
  store <4 x float> %".85", ptr %".44", align 4
  %".87" = load <4 x float>, ptr %".7"
  %".88" = fsub <4 x float> splat (float              0x0), %".87"
  %".89" = fcmp olt <4 x float> %".88", splat (float 0xc055d33340000000)
  %".90" = fcmp uno <4 x float> %".88", %".88"
  %".91" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".88", <4 x float> splat (float 0xc055d33340000000))
  %".92" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".91", <4 x float> splat (float 0x4056133340000000))
  %".93" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".92", <4 x float> splat (float 0x3ff7154760000000), <4 x float> splat (float 0x3fe0000000000000))
  %".94" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".93")
  %".95" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".94", <4 x float> splat (float 0xbfe6300000000000), <4 x float> %".92")
  %".96" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".94", <4 x float> splat (float 0x3f2bd01060000000), <4 x float> %".95")
  %".97" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> splat (float 0x3f2a0d2ce0000000), <4 x float> %".96", <4 x float> splat (float 0x3f56e879c0000000))
  %".98" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".97", <4 x float> %".96", <4 x float> splat (float 0x3f81112100000000))
  %".99" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".98", <4 x float> %".96", <4 x float> splat (float 0x3fa5553820000000))
  %".100" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".99", <4 x float> %".96", <4 x float> splat (float 0x3fc5555540000000))
  %".101" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".100", <4 x float> %".96", <4 x float> splat (float 0x3fe0000000000000))
  %".102" = fmul <4 x float> %".96", %".96"
  %".103" = fadd <4 x float> %".96", splat (float 0x3ff0000000000000)
  %".104" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".101", <4 x float> %".102", <4 x float> %".103")
  %".105" = fptosi <4 x float> %".94" to <4 x i32>
  %".106" = add <4 x i32> %".105", splat (i32 127)
  %".107" = shl <4 x i32> %".106", splat (i32 23)
  %".108" = bitcast <4 x i32> %".107" to <4 x float>
  %".109" = fmul <4 x float> %".104", %".108"
  %".110" = select  <4 x i1> %".89", <4 x float> splat (float              0x0), <4 x float> %".109"
  %".111" = select  <4 x i1> %".90", <4 x float> %".88", <4 x float> %".110"
  %".112" = fadd <4 x float> splat (float 0x3ff0000000000000), %".111"
  %".113" = fcmp ogt <4 x float> %".112", splat (float 0x43f0000000000000)
  %".114" = select  <4 x i1> %".113", <4 x float> splat (float 0x3ff0000000000000), <4 x float> %".112"
  %".115" = bitcast <4 x float> %".114" to <4 x i32>
  %".116" = sub <4 x i32> splat (i32 2129859011), %".115"
  %".117" = bitcast <4 x i32> %".116" to <4 x float>
  %".118" = fneg <4 x float> %".114"
  %".119" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".118", <4 x float> %".117", <4 x float> splat (float 0x3ff0000000000000))
  %".120" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".117", <4 x float> %".119", <4 x float> %".117")
  %".121" = fneg <4 x float> %".114"
  %".122" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".121", <4 x float> %".120", <4 x float> splat (float 0x3ff0000000000000))
  %".123" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".120", <4 x float> %".122", <4 x float> %".120")
  %".124" = fneg <4 x float> %".114"
  %".125" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".124", <4 x float> %".123", <4 x float> splat (float 0x3ff0000000000000))
  %".126" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".123", <4 x float> %".125", <4 x float> %".123")
  %".127" = select  <4 x i1> %".113", <4 x float> splat (float              0x0), <4 x float> %".126"
  %".128" = getelementptr inbounds float, ptr %".44", i64 4
  store <4 x float> %".127", ptr %".128", align 4
  %".130" = add nsw nuw i64 %"i", 1
  %".131" = icmp slt i64 %".130", 3
  br i1 %".131", label %"i.body", label %"i.done"
i.done:
  ret void
}

declare <4 x float> @"llvm.fma.v4f32"(<4 x float> %".1", <4 x float> %".2", <4 x float> %".3")

declare <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.floor.v4f32"(<4 x float> %".1")
