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
  %"i" = phi  i64 [0, %"entry"], [%".98", %"i.body"]
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
  %".48" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".46", <4 x float> splat (float 0xc055d33340000000))
  %".49" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".48", <4 x float> splat (float 0x4056133340000000))
  %".50" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".49", <4 x float> splat (float 0x3ff7154760000000), <4 x float> splat (float 0x3fe0000000000000))
  %".51" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".50")
  %".52" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".51", <4 x float> splat (float 0xbfe6300000000000), <4 x float> %".49")
  %".53" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".51", <4 x float> splat (float 0x3f2bd01060000000), <4 x float> %".52")
  %".54" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> splat (float 0x3f2a0d2ce0000000), <4 x float> %".53", <4 x float> splat (float 0x3f56e879c0000000))
  %".55" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".54", <4 x float> %".53", <4 x float> splat (float 0x3f81112100000000))
  %".56" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".55", <4 x float> %".53", <4 x float> splat (float 0x3fa5553820000000))
  %".57" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".56", <4 x float> %".53", <4 x float> splat (float 0x3fc5555540000000))
  %".58" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".57", <4 x float> %".53", <4 x float> splat (float 0x3fe0000000000000))
  %".59" = fmul <4 x float> %".53", %".53"
  %".60" = fadd <4 x float> %".53", splat (float 0x3ff0000000000000)
  %".61" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".58", <4 x float> %".59", <4 x float> %".60")
  %".62" = fptosi <4 x float> %".51" to <4 x i32>
  %".63" = add <4 x i32> %".62", splat (i32 127)
  %".64" = shl <4 x i32> %".63", splat (i32 23)
  %".65" = bitcast <4 x i32> %".64" to <4 x float>
  %".66" = fmul <4 x float> %".61", %".65"
  %".67" = select  <4 x i1> %".47", <4 x float> splat (float              0x0), <4 x float> %".66"
  %".68" = fadd <4 x float> splat (float 0x3ff0000000000000), %".67"
  %".69" = fdiv <4 x float> splat (float 0x3ff0000000000000), %".68"
  store <4 x float> %".69", ptr %".44", align 4
  %".71" = load <4 x float>, ptr %".7"
  %".72" = fsub <4 x float> splat (float              0x0), %".71"
  %".73" = fcmp olt <4 x float> %".72", splat (float 0xc055d33340000000)
  %".74" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".72", <4 x float> splat (float 0xc055d33340000000))
  %".75" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".74", <4 x float> splat (float 0x4056133340000000))
  %".76" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".75", <4 x float> splat (float 0x3ff7154760000000), <4 x float> splat (float 0x3fe0000000000000))
  %".77" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".76")
  %".78" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".77", <4 x float> splat (float 0xbfe6300000000000), <4 x float> %".75")
  %".79" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".77", <4 x float> splat (float 0x3f2bd01060000000), <4 x float> %".78")
  %".80" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> splat (float 0x3f2a0d2ce0000000), <4 x float> %".79", <4 x float> splat (float 0x3f56e879c0000000))
  %".81" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".80", <4 x float> %".79", <4 x float> splat (float 0x3f81112100000000))
  %".82" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".81", <4 x float> %".79", <4 x float> splat (float 0x3fa5553820000000))
  %".83" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".82", <4 x float> %".79", <4 x float> splat (float 0x3fc5555540000000))
  %".84" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".83", <4 x float> %".79", <4 x float> splat (float 0x3fe0000000000000))
  %".85" = fmul <4 x float> %".79", %".79"
  %".86" = fadd <4 x float> %".79", splat (float 0x3ff0000000000000)
  %".87" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".84", <4 x float> %".85", <4 x float> %".86")
  %".88" = fptosi <4 x float> %".77" to <4 x i32>
  %".89" = add <4 x i32> %".88", splat (i32 127)
  %".90" = shl <4 x i32> %".89", splat (i32 23)
  %".91" = bitcast <4 x i32> %".90" to <4 x float>
  %".92" = fmul <4 x float> %".87", %".91"
  %".93" = select  <4 x i1> %".73", <4 x float> splat (float              0x0), <4 x float> %".92"
  %".94" = fadd <4 x float> splat (float 0x3ff0000000000000), %".93"
  %".95" = fdiv <4 x float> splat (float 0x3ff0000000000000), %".94"
  %".96" = getelementptr inbounds float, ptr %".44", i64 4
  store <4 x float> %".95", ptr %".96", align 4
  %".98" = add nsw nuw i64 %"i", 1
  %".99" = icmp slt i64 %".98", 3
  br i1 %".99", label %"i.body", label %"i.done"
i.done:
  ret void
}

declare <4 x float> @"llvm.fma.v4f32"(<4 x float> %".1", <4 x float> %".2", <4 x float> %".3")

declare <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.floor.v4f32"(<4 x float> %".1")
